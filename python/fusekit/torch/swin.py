"""Fused forwards for timm's Swin Transformer (timm.models.swin_transformer): the block's attention
branch as LayerNorm + shift + window partition (one kernel), the qkv GEMM, window attention with
the relative position bias and shift mask (one kernel each way, the bias table's gradient
included), the projection GEMM, and window reverse + reverse shift + residual add (one kernel);
its MLP branch as LayerNorm, a GEMM, bias + GELU and a GEMM; PatchMerging as the 2x2 gather +
LayerNorm (one kernel) and the reduction GEMM. Parameters and buffers are the modules' own.

A block runs as one op (fusekit::swin_block) unless it has projection dropout in training;
otherwise as the ops above. Stochastic depth (DropPath)
keeps timm's semantics: each sample's branch is dropped with the
module's probability and the kept ones scaled by 1 / keep, drawn from PyTorch's generator (other
draws than timm's). A call the kernels do not cover (a resolution that is not a multiple of the
window, float32 without autocast for the attention, CPU tensors) runs the original forward.
"""

import os

import torch
import torch.nn.functional as F

from fusekit import ops
from fusekit.matching import gelu_form
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
}
