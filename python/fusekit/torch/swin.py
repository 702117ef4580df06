"""Fused forwards for timm's Swin Transformer (timm.models.swin_transformer) and Hugging Face's
(transformers' SwinLayer, FusedSwinLayer below): the block's attention
branch as LayerNorm + shift + window partition (one kernel), the qkv GEMM, window attention with
the relative position bias and shift mask (one kernel each way, the bias table's gradient
included), the projection GEMM, and window reverse + reverse shift + residual add (one kernel);
its MLP branch as LayerNorm, a GEMM, bias + GELU and a GEMM; PatchMerging as the 2x2 gather +
LayerNorm (one kernel) and the reduction GEMM. Parameters and buffers are the modules' own.

A timm block runs as one op (fusekit::swin_block) unless it has projection dropout in training,
or BLOCK_OP is False (FUSEKIT_SWIN_BLOCK_OP=0 at import): then as the ops above. Hugging Face's
SwinLayer has the block op only: where it cannot take a call (dropout in training, padding, a
shrunk window, head masks, attention maps) or BLOCK_OP is False, its original forward runs.
Stochastic depth (DropPath)
keeps timm's semantics: each sample's branch is dropped with the
module's probability and the kept ones scaled by 1 / keep, drawn from PyTorch's generator (other
draws than timm's). A call the kernels do not cover (a resolution that is not a multiple of the
window, float32 without autocast for the attention, CPU tensors) runs the original forward.
"""

import inspect
import os

import torch
import torch.nn.functional as F

from fusekit import ops
from fusekit.matching import gelu_form, hf_swin_parts
from fusekit.torch.bert import HALF, compute_dtype


def _drop_path_scale(module, batch, like):
    """Per-sample scale of a branch under timm's DropPath (None: identity)."""
    p = getattr(module, "drop_prob", 0.0)
    if not module.training or not p:
        return None
    keep = 1.0 - p
    scale = like.new_empty((batch,)).bernoulli_(keep)
    if getattr(module, "scale_by_keep", True) and keep > 0:
        scale.div_(keep)
    return scale


def _int32_index(attn):
    """The relative position index as int32 (the kernel's type), converted once per buffer: the
    buffer is int64 and fixed; a new buffer (after .to(), a load) is converted again."""
    index = attn.relative_position_index
    if torch.compiler.is_compiling():
        return index.to(torch.int32)
    cached = attn.__dict__.get("_fusekit_index")
    if cached is None or cached[0] is not index or cached[1] != index._version:
        cached = (index, index._version, index.to(torch.int32))
        attn.__dict__["_fusekit_index"] = cached
    return cached[2]


# Whether a block without projection dropout runs as one op (fusekit::swin_block: one autograd
# node, its parameters cast once inside, stochastic depth as per-sample scales) rather than the
# per-op path below; False (or FUSEKIT_SWIN_BLOCK_OP=0 in the environment) to compare the two.
BLOCK_OP = os.environ.get("FUSEKIT_SWIN_BLOCK_OP", "1") != "0"


def _drops(block):
    """Whether this call draws a dropout mask, which the block op has not: projection dropout in
    training (stochastic depth it takes, as per-sample scales)."""
    return bool(block.training and block.attn.proj_drop.p)


class FusedSwinTransformerBlock:
    """The residual stream stays in the block input's dtype (float32 under autocast, as timm's
    additions leave it), and so do the LayerNorms and the window partition and merge that carry
    it; the GEMMs, the window attention and bias + GELU run in the autocast dtype."""

    def forward(self, x):
        batch, height, width, channels = x.shape
        window, shift = self.window_size[0], self.shift_size[0]
        dtype = compute_dtype(x)
        if (dtype not in HALF or not x.is_cuda or height % window or width % window
                or getattr(self, "dynamic_mask", False)):
            return self._fusekit_original.forward(self, x)
        attn, norm1, norm2, mlp = self.attn, self.norm1, self.norm2, self.mlp
        stream = x.dtype
        x = x.contiguous()
        mask = self.attn_mask.float() if shift and self.attn_mask is not None else None
        if BLOCK_OP and not _drops(self):
            params = [norm1.weight, norm1.bias, attn.qkv.weight, attn.qkv.bias, attn.relative_position_bias_table,
                      attn.proj.weight, attn.proj.bias, norm2.weight, norm2.bias, mlp.fc1.weight, mlp.fc1.bias,
                      mlp.fc2.weight, mlp.fc2.bias]
            return ops.swin_block(x, params, _int32_index(attn), mask, dtype, window, shift, attn.num_heads,
                                  attn.scale, norm1.eps, norm2.eps, gelu_form(mlp.act),
                                  _drop_path_scale(self.drop_path1, batch, x),
                                  _drop_path_scale(self.drop_path2, batch, x))
        windows = ops.window_partition(x, norm1.weight.to(stream), norm1.bias.to(stream), window, shift, norm1.eps)
        qkv = F.linear(windows.to(dtype), attn.qkv.weight.to(dtype), attn.qkv.bias.to(dtype))
        qkv = qkv.view(windows.shape[0], window * window, 3, attn.num_heads, -1)
        index = _int32_index(attn)
        out = ops.window_attention(qkv, attn.relative_position_bias_table.to(dtype), index, mask, attn.scale)
        proj = F.linear(out, attn.proj.weight.to(dtype), attn.proj.bias.to(dtype))
        proj = F.dropout(proj, attn.proj_drop.p, self.training)
        scale = _drop_path_scale(self.drop_path1, batch, proj)
        if scale is not None:
            windows_per_image = proj.shape[0] // batch
            proj = proj * scale.repeat_interleave(windows_per_image)[:, None, None]
        x = ops.window_merge(proj.to(stream), x, window, shift)  # x + the attention branch, [B, H, W, C]
        tokens = x.reshape(batch, height * width, channels)
        h = ops.layer_norm(tokens, norm2.weight.to(stream), norm2.bias.to(stream), norm2.eps)
        h = F.linear(h.to(dtype), mlp.fc1.weight.to(dtype))
        h = ops.bias_gelu(h, mlp.fc1.bias.to(dtype), gelu_form(mlp.act))
        h = F.linear(h, mlp.fc2.weight.to(dtype), mlp.fc2.bias.to(dtype))
        scale = _drop_path_scale(self.drop_path2, batch, h)
        if scale is not None:
            h = h * scale[:, None, None]
        return (tokens + h).reshape(batch, height, width, channels)


def _hf_mask(layer, height, width, device):
    """The shifted-window mask of a Hugging Face SwinLayer (its get_attn_mask, float32 [windows,
    tokens, tokens]), made once per size and device instead of per call (a dozen small ops)."""
    def make():
        if layer._fusekit_mask_takes_device:
            return layer.get_attn_mask(height, width, dtype=torch.float32, device=device).contiguous()
        return layer.get_attn_mask(height, width, dtype=torch.float32).to(device).contiguous()

    if torch.compiler.is_compiling():
        return make()
    key = (height, width, int(layer.window_size), int(layer.shift_size), device)
    cached = layer.__dict__.get("_fusekit_mask")
    if cached is None or cached[0] != key:
        cached = (key, make())
        layer.__dict__["_fusekit_mask"] = cached
    return cached[1]


class FusedSwinLayer:
    """Hugging Face's SwinLayer (transformers' modeling_swin, either layout: fusekit.matching's
    hf_swin_parts) as one op, fusekit::swin_block: the query, key and value weights packed into one
    projection per call, stochastic depth on the branches Hugging Face applies it to (the attention
    branch only, in both layouts). A call the op cannot take (a size that is not a multiple of the
    window, which Hugging Face pads; a window shrunk below the attention's; dropout in training;
    head_mask or attention maps; float32 without autocast) runs the original forward."""

    @staticmethod
    def _fusekit_class_attributes(original):
        """How many branches this transformers' SwinLayer applies drop_path to, read from its source
        once (1: the attention branch, as in transformers 4; None where it cannot be read, and then a
        call with stochastic depth in training runs the original forward)."""
        try:
            count = inspect.getsource(original.forward).count("self.drop_path(")
        except (OSError, TypeError):
            count = 0
        try:  # get_attn_mask(height, width, dtype[, device]): its signature changed over versions
            takes_device = "device" in inspect.signature(original.get_attn_mask).parameters
        except (AttributeError, TypeError, ValueError):
            takes_device = False
        return {"_fusekit_drop_path_branches": count if count in (1, 2) else None,
                "_fusekit_mask_takes_device": takes_device}

    def forward(self, hidden_states, input_dimensions, *args, **kwargs):
        dtype = compute_dtype(hidden_states)
        parts = hf_swin_parts(self)
        branches = self._fusekit_drop_path_branches
        dropping = self.training and getattr(self.drop_path, "drop_prob", 0.0)
        if (not BLOCK_OP or parts is None or dtype not in HALF or not hidden_states.is_cuda
                or hidden_states.dim() != 3 or any(a is not None and a is not False for a in args)
                or kwargs.get("head_mask") is not None or kwargs.get("output_attentions")
                or (self.training and any(parts.dropouts)) or (dropping and branches is None)):
            return self._fusekit_original.forward(self, hidden_states, input_dimensions, *args, **kwargs)
        if not kwargs.get("always_partition", False):
            self.set_shift_and_window_size(input_dimensions)
        height, width = input_dimensions
        window, shift = int(self.window_size), int(self.shift_size)
        # The window must still be the attention's (set_shift_and_window_size shrinks it for a small
        # input, while the bias table and index stay those of the configured window).
        if height % window or width % window or window != tuple(parts.window)[0]:
            return self._fusekit_original.forward(self, hidden_states, input_dimensions, *args, **kwargs)
        batch, _, channels = hidden_states.shape
        x = hidden_states.contiguous().view(batch, height, width, channels)
        before, after = self.layernorm_before, self.layernorm_after
        params = [before.weight, before.bias, torch.cat([parts.q.weight, parts.k.weight, parts.v.weight]),
                  torch.cat([parts.q.bias, parts.k.bias, parts.v.bias]), parts.table, parts.o.weight, parts.o.bias,
                  after.weight, after.bias, parts.fc1.weight, parts.fc1.bias, parts.fc2.weight, parts.fc2.bias]
        mask = _hf_mask(self, height, width, x.device) if shift else None
        drop1 = _drop_path_scale(self.drop_path, batch, x)
        drop2 = _drop_path_scale(self.drop_path, batch, x) if branches == 2 else None
        y = ops.swin_block(x, params, _int32_index(parts.index_owner), mask, dtype, window, shift, parts.heads,
                           parts.scale, before.eps, after.eps, gelu_form(parts.act), drop1, drop2)
        y = y.view(batch, height * width, channels)
        return (y, None) if parts.returns_pair else (y,)


class FusedPatchMerging:
    def forward(self, x):
        batch, height, width, channels = x.shape
        if not x.is_cuda or height % 2 or width % 2:
            return self._fusekit_original.forward(self, x)
        norm = self.norm
        y = ops.patch_merging(x, norm.weight.to(x.dtype), norm.bias.to(x.dtype), norm.eps)
        return self.reduction(y)


FUSED = {
    "SwinTransformerBlock": FusedSwinTransformerBlock,
    "PatchMerging": FusedPatchMerging,
    "SwinLayer": FusedSwinLayer,
}
