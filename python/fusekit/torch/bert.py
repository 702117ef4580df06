"""Fused forwards for Hugging Face BERT modules (transformers' modeling_bert), with the modules'
own parameters: state_dict keys and values are unchanged, so checkpoints load both ways.

Each fused class subclasses the original and overrides forward; a call that the fused path cannot
compute exactly the same (float32 attention, cached keys, an attention map requested, a mask
the fused attention cannot read, such as a flex BlockMask, CPU tensors) runs the original forward
instead. A mask tensor that is not key padding on the right stops the program with a device-side
assert: reading it on the host would cost a sync per forward, and a guess would be a wrong result.

Mixed precision: under torch.autocast the fused ops run in the autocast dtype (float32
parameters are cast, as autocast casts a linear layer's weight); without autocast, in the
inputs' dtype. A residual stream that autocast would leave in float32 (LayerNorm outputs) stays
in the autocast dtype here, which halves its bytes.
"""

import dataclasses
import importlib
import weakref

import torch
import torch.nn.functional as F

from fusekit import ops
from fusekit.matching import gelu_form

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(x):
    """The dtype the fused ops run in for input x: autocast's where it is on (its GEMMs produce
    that dtype whatever x's is), else x's."""
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        if dtype in HALF:
            return dtype
    return x.dtype


def key_padding_lengths(mask, batch, seq, device):
    """Valid keys per sequence (int32 [batch]) from the mask a BERT attention layer receives: None
    (no padding), a 2D keep mask [batch, seq], or a 4D mask [batch|1, 1, queries|1, seq] (bool, True
    = attend, as for SDPA; or additive float, 0 = attend). A mask that is not key padding on the
    right stops the program with a device-side assert (no silent wrong result, no host sync).
    None where the mask is of a kind the fused attention cannot take (e.g. a flex BlockMask)."""
    if mask is None:
        return torch.full((batch,), seq, dtype=torch.int32, device=device)
    if not isinstance(mask, torch.Tensor) or mask.shape[-1] != seq or mask.dim() not in (2, 4):
        return None
    keep = mask if mask.dtype == torch.bool else (mask != 0 if mask.dim() == 2 else mask == 0)
    row = keep if keep.dim() == 2 else keep[:, 0, 0, :]
    row = row.expand(batch, seq)
    lengths = row.sum(-1, dtype=torch.int32)
    prefix = torch.arange(seq, device=device) < lengths[:, None]
    expected = prefix if keep.dim() == 2 else prefix[:, None, None, :]
    torch._assert_async((keep == expected).all(), "fusekit: BERT attention needs key padding on the right")
    return lengths


class _LengthsCache:
    """The lengths of the last mask seen: every layer of one forward receives the same mask tensor,
    so the mask is read once per forward instead of once per layer (a dozen small ops each). Keyed
    by the mask's identity and version counter (an in-place change to the mask misses); eager mode
    only: under torch.compile the lengths are traced per layer and the compiler dedupes them."""

    def __init__(self):
        self.key = None
        self.lengths = None

    def get(self, mask, batch, seq, device):
        if not isinstance(mask, torch.Tensor) or torch.compiler.is_compiling():
            return key_padding_lengths(mask, batch, seq, device)
        ref = self.key[0]() if self.key is not None else None
        key = (mask._version, batch, seq, device)
        if ref is mask and self.key[1:] == key:
            return self.lengths
        lengths = key_padding_lengths(mask, batch, seq, device)
        self.key, self.lengths = (weakref.ref(mask), *key), lengths
        return lengths


_lengths_cache = _LengthsCache()


def _dropout_p(module, dropout):
    return dropout.p if module.training else 0.0


class FusedBertEmbeddings:
    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                past_key_values_length=0):
        if input_ids is None or inputs_embeds is not None or not input_ids.is_cuda:
            return self._fusekit_original.forward(self, input_ids, token_type_ids, position_ids, inputs_embeds,
                                                  past_key_values_length)
        batch, seq = input_ids.shape
        if position_ids is None:
            position_ids = self.position_ids[:, past_key_values_length:past_key_values_length + seq]
        position_ids = position_ids.expand(batch, seq).long()
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        token_type_ids = token_type_ids.expand(batch, seq).long()
        input_ids = input_ids.long()  # the kernel reads int64 ids, as nn.Embedding takes any integer type
        word = self.word_embeddings
        norm = self.LayerNorm
        # In the tables' dtype (float32 under autocast, as nn.Embedding and LayerNorm run there).
        return ops.embedding_layer_norm(input_ids, position_ids, token_type_ids, word.weight,
                                        self.position_embeddings.weight, self.token_type_embeddings.weight,
                                        norm.weight, norm.bias, _dropout_p(self, self.dropout), norm.eps,
                                        word.padding_idx)


class FusedBertSelfAttention:
    def forward(self, hidden_states, attention_mask=None, past_key_values=None, **kwargs):
        dtype = compute_dtype(hidden_states)
        batch, seq = hidden_states.shape[:2]
        lengths = None
        wants_weights = kwargs.get("output_attentions") or getattr(self.config, "output_attentions", False)
        if (past_key_values is None and not wants_weights and kwargs.get("head_mask") is None
                and kwargs.get("encoder_hidden_states") is None and dtype in HALF and hidden_states.is_cuda
                and hidden_states.dim() == 3):
            lengths = _lengths_cache.get(attention_mask, batch, seq, hidden_states.device)
        if lengths is None:
            return self._fusekit_original.forward(self, hidden_states, attention_mask, past_key_values, **kwargs)
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight]).to(dtype)
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias]).to(dtype)
        qkv = F.linear(hidden_states.to(dtype), weight, bias)
        qkv = qkv.view(batch, seq, 3, self.num_attention_heads, self.attention_head_size)
        out = ops.bert_attention(qkv, lengths, self.scaling, _dropout_p(self, self.dropout))
        return out, None


class FusedBertSublayerOutput:
    """BertSelfOutput and BertOutput: LayerNorm(input_tensor + dropout(dense(hidden_states)))."""

    def forward(self, hidden_states, input_tensor):
        if not hidden_states.is_cuda:
            return self._fusekit_original.forward(self, hidden_states, input_tensor)
        dtype = compute_dtype(hidden_states)
        x = F.linear(hidden_states.to(dtype), self.dense.weight.to(dtype))
        norm = self.LayerNorm
        return ops.bias_dropout_residual_layer_norm(x, self.dense.bias.to(dtype), input_tensor.to(dtype),
                                                    norm.weight.to(dtype), norm.bias.to(dtype),
                                                    _dropout_p(self, self.dropout), norm.eps)


class FusedBertIntermediate:
    def forward(self, hidden_states):
        if not hidden_states.is_cuda:
            return self._fusekit_original.forward(self, hidden_states)
        dtype = compute_dtype(hidden_states)
        x = F.linear(hidden_states.to(dtype), self.dense.weight.to(dtype))
        return ops.bias_gelu(x, self.dense.bias.to(dtype), gelu_form(self.intermediate_act_fn))


def _layer_parameters(layer):
    """A BertLayer's 16 tensors in torch_ops/bert_layer.cpp's order."""
    attention, intermediate, output = layer.attention, layer.intermediate, layer.output
    own, out = attention.self, attention.output
    return [own.query.weight, own.query.bias, own.key.weight, own.key.bias, own.value.weight, own.value.bias,
            out.dense.weight, out.dense.bias, out.LayerNorm.weight, out.LayerNorm.bias,
            intermediate.dense.weight, intermediate.dense.bias, output.dense.weight, output.dense.bias,
            output.LayerNorm.weight, output.LayerNorm.bias]


class FusedBertLayer:
    """The whole encoder layer as one op (fusekit::bert_layer): one autograd node, its parameters
    cast once inside, its GEMMs through fusekit's cuBLASLt path. Calls the fused path cannot take
    (as FusedBertSelfAttention's) run the original forward, whose submodules may be fused one by
    one."""

    @staticmethod
    def _fusekit_class_attributes(original):
        """Set once on the fused class (fusekit.torch._fused_class), so that forward reads a
        constant: whether this transformers' BertLayer returns a tuple (layer_output, ...) (4.x)
        rather than the tensor (5.x); the fused forward returns what the original would."""
        package = importlib.import_module(original.__module__.split(".")[0])
        major = str(getattr(package, "__version__", "5")).split(".")[0]
        return {"_fusekit_returns_tuple": major.isdigit() and int(major) < 5}

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        dtype = compute_dtype(hidden_states)
        own = self.attention.self
        wants_weights = kwargs.get("output_attentions") or getattr(getattr(own, "config", None), "output_attentions",
                                                                   False)
        lengths = None
        # Positional arguments after the mask (head_mask, encoder states, caches, output_attentions:
        # their order differs between transformers 4 and 5) must all be off.
        if (all(a is None or a is False for a in args)
                and kwargs.get("past_key_values", kwargs.get("past_key_value")) is None and not wants_weights
                and kwargs.get("head_mask") is None and kwargs.get("encoder_hidden_states") is None
                and dtype in HALF and hidden_states.is_cuda and hidden_states.dim() == 3):
            batch, seq = hidden_states.shape[:2]
            lengths = _lengths_cache.get(attention_mask, batch, seq, hidden_states.device)
        if lengths is None:
            return self._fusekit_original.forward(self, hidden_states, attention_mask, *args, **kwargs)
        out = self.attention.output
        y = ops.bert_layer(hidden_states.to(dtype), lengths, _layer_parameters(self), own.num_attention_heads,
                           own.scaling if hasattr(own, "scaling") else own.attention_head_size ** -0.5,
                           _dropout_p(own, own.dropout), _dropout_p(out, out.dropout),
                           _dropout_p(self.output, self.output.dropout), out.LayerNorm.eps,
                           gelu_form(self.intermediate.intermediate_act_fn))
        return (y,) if self._fusekit_returns_tuple else y


class FusedBertPredictionHeadTransform:
    def forward(self, hidden_states):
        if not hidden_states.is_cuda:
            return self._fusekit_original.forward(self, hidden_states)
        dtype = compute_dtype(hidden_states)
        x = F.linear(hidden_states.to(dtype), self.dense.weight.to(dtype))
        x = ops.bias_gelu(x, self.dense.bias.to(dtype), gelu_form(self.transform_act_fn))
        norm = self.LayerNorm
        return ops.layer_norm(x, norm.weight.to(dtype), norm.bias.to(dtype), norm.eps)


class FusedBertForMaskedLM:
    """The masked-LM loss as fusekit's cross_entropy on the logits' own dtype: PyTorch's autocast
    runs cross_entropy in float32, a float32 copy of the [tokens, vocabulary] logits."""

    def forward(self, *args, labels=None, return_dict=None, **kwargs):
        out = self._fusekit_original.forward(self, *args, labels=None, return_dict=True, **kwargs)
        if labels is not None:
            logits = out.logits.view(-1, self.config.vocab_size)
            labels = labels.view(-1).to(logits.device)
            if logits.is_cuda:
                loss = ops.cross_entropy(logits, labels, ignore_index=-100)
            else:
                loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
            out = dataclasses.replace(out, loss=loss)
        use_dict = return_dict if return_dict is not None else getattr(self.config, "return_dict", True)
        return out if use_dict else out.to_tuple()


FUSED = {
    "BertEmbeddings": FusedBertEmbeddings,
    "BertLayer": FusedBertLayer,
    "BertSelfAttention": FusedBertSelfAttention,
    "BertSelfOutput": FusedBertSublayerOutput,
    "BertOutput": FusedBertSublayerOutput,
    "BertIntermediate": FusedBertIntermediate,
    "BertPredictionHeadTransform": FusedBertPredictionHeadTransform,
    "BertForMaskedLM": FusedBertForMaskedLM,
}
