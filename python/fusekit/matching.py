"""Which modules of a model fusekit replaces, and why it leaves the others alone: Hugging Face BERT,
timm's Swin Transformer and Hugging Face's (its SwinLayer).

Plain Python over the modules' class names and attributes (no PyTorch import), so the rules are
tested on the CPU with stand-in modules. fusekit.torch.patch applies the decisions.

A module is fused only where the fused version computes the same function; otherwise it is kept
with a reason. Conditions that only a call can tell (float32 inputs, a mask the fused attention
cannot read, cached keys and values, an attention map requested) make a fused module run the
original forward for that call instead; a mask tensor that is not key padding on the right is a
device-side assert (see fusekit/torch/bert.py).
"""

from collections import namedtuple

Decision = namedtuple("Decision", "path kind fused reason")

# head_dim values that kernels/bert_attention.h supports.
ATTENTION_HEAD_DIMS = (32, 64, 128)

# Activation modules of Hugging Face (transformers.activations) by class name -> the GELU form
# of kernels/bias_gelu.h: "none" is the exact (erf) GELU, "tanh" its tanh approximation.
GELU_FORMS = {
    "GELUActivation": "none",
    "GELU": "none",
    "NewGELUActivation": "tanh",
    "GELUTanh": "tanh",
    "PytorchGELUTanh": "tanh",
}


def gelu_form(activation):
    """The bias_gelu form of an activation module, or None. A GELUActivation that runs its own
    Python formula (use_gelu_python) computes the same erf GELU."""
    name = type(activation).__name__
    if name == "GELU":
        return "tanh" if getattr(activation, "approximate", "none") == "tanh" else "none"
    return GELU_FORMS.get(name)


def _affine_layer_norm(norm):
    return (norm is not None and getattr(norm, "weight", None) is not None
            and getattr(norm, "bias", None) is not None and len(getattr(norm, "normalized_shape", (0, 0))) == 1)


def _absolute_positions(module):
    config = getattr(module, "config", None)
    kind = getattr(module, "position_embedding_type", None) or getattr(config, "position_embedding_type", None)
    return kind in (None, "absolute")


def _linear_with_bias(linear):
    return linear is not None and getattr(linear, "bias", None) is not None


def _embeddings(m):
    if not _absolute_positions(m):
        return False, "relative position embeddings (fused: absolute only)"
    if not _affine_layer_norm(getattr(m, "LayerNorm", None)):
        return False, "LayerNorm without weight and bias"
    if any(getattr(m, name, None) is None for name in ("word_embeddings", "position_embeddings",
                                                       "token_type_embeddings")):
        return False, "missing one of the word, position and token-type tables"
    return True, "embedding_layernorm (three lookups + LayerNorm + dropout)"


def _self_attention(m):
    head_dim = getattr(m, "attention_head_size", None)
    if head_dim not in ATTENTION_HEAD_DIMS:
        return False, f"head_dim {head_dim} (fused: {', '.join(map(str, ATTENTION_HEAD_DIMS))})"
    if getattr(m, "is_decoder", False) or getattr(m, "is_causal", False):
        return False, "decoder (causal) attention (fused: bidirectional with key padding)"
    if not _absolute_positions(m):
        return False, "relative position scores (fused: absolute positions only)"
    if not all(_linear_with_bias(getattr(m, name, None)) for name in ("query", "key", "value")):
        return False, "query, key or value without bias"
    return True, "one QKV GEMM + bert_attention (padding mask, dropout)"


def _sublayer_output(m):
    if not _linear_with_bias(getattr(m, "dense", None)):
        return False, "dense without bias"
    if not _affine_layer_norm(getattr(m, "LayerNorm", None)):
        return False, "LayerNorm without weight and bias"
    return True, "GEMM + bias_dropout_residual_layernorm"


def _intermediate(m):
    form = gelu_form(getattr(m, "intermediate_act_fn", None))
    if form is None:
        return False, f"activation {type(getattr(m, 'intermediate_act_fn', None)).__name__} (fused: GELU)"
    if not _linear_with_bias(getattr(m, "dense", None)):
        return False, "dense without bias"
    return True, f"GEMM + bias_gelu ({form})"


def _original_kind(module):
    """A module's class name, or its original's where fusekit.torch.patch already swapped it."""
    kind = type(module)
    return getattr(kind, "_fusekit_original", kind).__name__


def _layer(m):
    """A whole encoder layer as one op: its four parts must each be fusable, and the layer an
    encoder's (no cross-attention, no feed-forward chunking)."""
    attention = getattr(m, "attention", None)
    parts = [("attention.self", getattr(attention, "self", None), "BertSelfAttention", _self_attention),
             ("attention.output", getattr(attention, "output", None), "BertSelfOutput", _sublayer_output),
             ("intermediate", getattr(m, "intermediate", None), "BertIntermediate", _intermediate),
             ("output", getattr(m, "output", None), "BertOutput", _sublayer_output)]
    for name, part, kind, rule in parts:
        if part is None or _original_kind(part) != kind:
            return False, f"{name} is not a {kind}"
        fused, reason = rule(part)
        if not fused:
            return False, f"{name}: {reason}"
    if getattr(m, "add_cross_attention", False) or getattr(m, "crossattention", None) is not None:
        return False, "cross-attention (fused: encoder layers)"
    if getattr(m, "chunk_size_feed_forward", 0):
        return False, "feed-forward chunking (fused: the whole sequence at once)"
    if getattr(attention.output.LayerNorm, "eps", None) != getattr(m.output.LayerNorm, "eps", None):
        return False, "the two LayerNorms have different eps"
    form = gelu_form(m.intermediate.intermediate_act_fn)
    return True, f"one op per layer: QKV GEMM, bert_attention, GEMMs, GELU ({form}), two residual LayerNorms"


def _head_transform(m):
    form = gelu_form(getattr(m, "transform_act_fn", None))
    if form is None:
        return False, f"activation {type(getattr(m, 'transform_act_fn', None)).__name__} (fused: GELU)"
    if not _linear_with_bias(getattr(m, "dense", None)) or not _affine_layer_norm(getattr(m, "LayerNorm", None)):
        return False, "dense without bias or LayerNorm without weight and bias"
    return True, f"GEMM + bias_gelu ({form}) + layernorm"


def _masked_lm(m):
    return True, "cross_entropy on the logits' own dtype (no float32 copy)"


# kernels/window_attention.h's shapes.
WINDOW_TOKENS = (49, 144)
WINDOW_HEAD_DIMS = (32, 64)


def _pair_equal(value):
    return value is not None and len(tuple(value)) == 2 and tuple(value)[0] == tuple(value)[1]


def _swin_block(m):
    attn, mlp = getattr(m, "attn", None), getattr(m, "mlp", None)
    if attn is None or mlp is None:
        return False, "no attn or mlp"
    if not _pair_equal(getattr(m, "window_size", None)) or not _pair_equal(getattr(m, "shift_size", None)):
        return False, "a window or shift that is not square"
    tokens = getattr(attn, "window_area", None)
    if tokens not in WINDOW_TOKENS:
        return False, f"window of {tokens} tokens (fused: 7x7 or 12x12)"
    heads = getattr(attn, "num_heads", 0)
    qkv = getattr(attn, "qkv", None)
    head_dim = getattr(qkv, "out_features", 0) // 3 // heads if heads else 0
    if head_dim not in WINDOW_HEAD_DIMS:
        return False, f"head_dim {head_dim} (fused: {', '.join(map(str, WINDOW_HEAD_DIMS))})"
    if not _linear_with_bias(qkv) or not _linear_with_bias(getattr(attn, "proj", None)):
        return False, "qkv or proj without bias"
    if getattr(getattr(attn, "attn_drop", None), "p", 0):
        return False, "attention dropout (the fused window attention has none)"
    if getattr(m, "dynamic_mask", False):
        return False, "dynamic mask"
    if not _affine_layer_norm(getattr(m, "norm1", None)) or not _affine_layer_norm(getattr(m, "norm2", None)):
        return False, "norm1 or norm2 is not an affine LayerNorm"
    if type(mlp).__name__ != "Mlp" or not _linear_with_bias(getattr(mlp, "fc1", None)) \
            or not _linear_with_bias(getattr(mlp, "fc2", None)):
        return False, f"MLP {type(mlp).__name__} (fused: timm's Mlp with biases)"
    if gelu_form(getattr(mlp, "act", None)) is None:
        return False, f"activation {type(getattr(mlp, 'act', None)).__name__} (fused: GELU)"
    if any(getattr(getattr(mlp, name, None), "p", 0) for name in ("drop1", "drop2")) or \
            type(getattr(mlp, "norm", None)).__name__ not in ("Identity", "NoneType"):
        return False, "MLP dropout or norm (not fused)"
    return True, "LN + shift + partition, QKV GEMM, window_attention, proj GEMM, merge + residual, MLP"


HfSwinParts = namedtuple("HfSwinParts", "q k v o index_owner table heads head_dim scale window dropouts fc1 fc2 act "
                                         "returns_pair")


def _p(dropout):
    """A dropout module's p, or a float attribute's value, or 0."""
    return getattr(dropout, "p", dropout) if dropout is not None else 0.0


def hf_swin_parts(m):
    """The parts of a Hugging Face SwinLayer that fusekit::swin_block takes, in either of its
    layouts: transformers 4's (attention.self.query/key/value, attention.output.dense, intermediate
    and output; the layer returns a 1-tuple) or the later one built on ViTLayer (attention.q_proj/
    k_proj/v_proj/o_proj, attention.relative_position_bias, mlp.fc1/fc2; it returns (output,
    attention weights)). None for neither."""
    attention = getattr(m, "attention", None)
    own = getattr(attention, "self", None)
    if own is not None and getattr(attention, "output", None) is not None:
        head_dim = getattr(own, "attention_head_size", None)
        intermediate, output = getattr(m, "intermediate", None), getattr(m, "output", None)
        return HfSwinParts(getattr(own, "query", None), getattr(own, "key", None), getattr(own, "value", None),
                           getattr(attention.output, "dense", None), own,
                           getattr(own, "relative_position_bias_table", None), getattr(own, "num_attention_heads", 0),
                           head_dim, head_dim ** -0.5 if head_dim else None, getattr(own, "window_size", None),
                           (_p(getattr(own, "dropout", None)), _p(getattr(attention.output, "dropout", None)),
                            _p(getattr(output, "dropout", None))),
                           getattr(intermediate, "dense", None), getattr(output, "dense", None),
                           getattr(intermediate, "intermediate_act_fn", None), False)
    bias = getattr(attention, "relative_position_bias", None)
    mlp = getattr(m, "mlp", None)
    if attention is None or bias is None or mlp is None:
        return None
    return HfSwinParts(getattr(attention, "q_proj", None), getattr(attention, "k_proj", None),
                       getattr(attention, "v_proj", None), getattr(attention, "o_proj", None), bias,
                       getattr(bias, "relative_position_bias_table", None),
                       getattr(attention, "num_attention_heads", 0), getattr(attention, "head_dim", None),
                       getattr(attention, "scaling", None),
                       getattr(bias, "window_size", None),
                       (_p(getattr(attention, "attention_dropout", None)), _p(getattr(m, "dropout", None))),
                       getattr(mlp, "fc1", None), getattr(mlp, "fc2", None), getattr(mlp, "activation_fn", None), True)


def _hf_swin_layer(m):
    """Hugging Face's SwinLayer (transformers' modeling_swin) as fusekit::swin_block: the query, key
    and value projections packed into one, the MLP as timm's."""
    parts = hf_swin_parts(m)
    if parts is None:
        return False, "neither of Hugging Face's SwinLayer layouts (attention.self / attention.q_proj)"
    if not all(_linear_with_bias(x) for x in (parts.q, parts.k, parts.v)):
        return False, "query, key or value without bias (qkv_bias=False)"
    if parts.table is None or getattr(parts.index_owner, "relative_position_index", None) is None:
        return False, "no relative position bias"
    if parts.head_dim not in WINDOW_HEAD_DIMS:
        return False, f"head_dim {parts.head_dim} (fused: {', '.join(map(str, WINDOW_HEAD_DIMS))})"
    if not _pair_equal(parts.window) or tuple(parts.window)[0] ** 2 not in WINDOW_TOKENS:
        return False, f"window {parts.window} (fused: 7x7 or 12x12)"
    if not _linear_with_bias(parts.o):
        return False, "attention output projection without bias"
    if not _affine_layer_norm(getattr(m, "layernorm_before", None)) or \
            not _affine_layer_norm(getattr(m, "layernorm_after", None)):
        return False, "layernorm_before or layernorm_after is not an affine LayerNorm"
    form = gelu_form(parts.act)
    if form is None:
        return False, f"activation {type(parts.act).__name__} (fused: GELU)"
    if not _linear_with_bias(parts.fc1) or not _linear_with_bias(parts.fc2):
        return False, "MLP dense without bias"
    return True, f"one op per block (fusekit::swin_block): LN + shift + partition, QKV GEMM, window attention, " \
                 f"proj GEMM, merge + residual, MLP with GELU ({form})"


def _patch_merging(m):
    norm = getattr(m, "norm", None)
    if not _affine_layer_norm(norm):
        return False, "norm is not an affine LayerNorm"
    reduction = getattr(m, "reduction", None)
    if reduction is None or getattr(reduction, "bias", None) is not None:
        return False, "reduction with a bias"
    # timm's Swin normalizes the 4C gathered channels before the reduction; SwinV2's PatchMerging
    # (same name) reduces first and normalizes the 2C outputs.
    if tuple(getattr(norm, "normalized_shape", ())) != (getattr(reduction, "in_features", None),):
        return False, "the norm is not over the reduction's input (SwinV2's order: reduction, then norm)"
    return True, "2x2 gather + LayerNorm (patch_merging) + reduction GEMM"


RULES = {
    "BertEmbeddings": _embeddings,
    "BertLayer": _layer,
    "BertSelfAttention": _self_attention,
    "BertSelfOutput": _sublayer_output,
    "BertOutput": _sublayer_output,
    "BertIntermediate": _intermediate,
    "BertPredictionHeadTransform": _head_transform,
    "BertForMaskedLM": _masked_lm,
    "SwinTransformerBlock": _swin_block,
    "PatchMerging": _patch_merging,
    "SwinLayer": _hf_swin_layer,
}

# Modules fusekit knows and never replaces (reported so that the report is complete).
KEPT = {
    "BertCrossAttention": "cross-attention (fused: self-attention only)",
}


def kinds(names, argument):
    """`names` (module class names, e.g. {"BertSelfAttention"}, or the classes; one as a string or a
    class) as a frozenset of names, after checking that fusekit fuses each: a ValueError naming the
    argument and the kinds otherwise, a TypeError for what is neither a name nor a class."""
    if names is None:
        return None
    names = [names] if isinstance(names, (str, type)) else list(names)
    for n in names:
        if not isinstance(n, (str, type)):
            raise TypeError(f"fusekit: {argument} takes module class names or classes, not {type(n).__name__}")
    names = frozenset(n.__name__ if isinstance(n, type) else n for n in names)
    unknown = sorted(n for n in names if n not in RULES)
    if unknown:
        raise ValueError(f"fusekit: {argument} names {', '.join(repr(n) for n in unknown)}, which fusekit does not "
                         f"fuse (it fuses: {', '.join(RULES)})")
    return names


def selection(only, exclude):
    """patch()'s only= and exclude= checked together: (only as kinds() gives it, exclude as a
    frozenset). An empty only= (it would fuse nothing) and a kind in both are ValueErrors."""
    only, exclude = kinds(only, "only="), kinds(exclude, "exclude=") or frozenset()
    if only is not None and not only:
        raise ValueError("fusekit: only= names no kind (None, the default, fuses every kind)")
    if only is not None and only & exclude:
        raise ValueError(f"fusekit: {', '.join(sorted(only & exclude))} in both only= and exclude=")
    return only, exclude


def decide(path, module, only=None, exclude=frozenset()):
    """The decision for one module, or None for a module fusekit has no rule for. `only` (None: every
    kind) and `exclude`: the kinds the caller asked for and against (kinds() checks them); a module
    the caller left out is kept, with that reason."""
    kind = type(module).__name__
    if kind in RULES:
        if only is not None and kind not in only:
            return Decision(path, kind, False, "left out by the caller (not in only=)")
        if kind in exclude:
            return Decision(path, kind, False, "left out by the caller (in exclude=)")
        fused, reason = RULES[kind](module)
        return Decision(path, kind, fused, reason)
    if kind in KEPT:
        return Decision(path, kind, False, KEPT[kind])
    return None


# Kinds whose fused op runs their whole subtree: a fused module inside one runs only on calls that
# the enclosing op cannot take (fusekit::bert_layer's fallbacks), which the summary says.
WHOLE_LAYER = frozenset({"BertLayer"})


def _enclosing_layer(decision, layers):
    """The kind of the nearest fused WHOLE_LAYER module above `decision`'s path, or None."""
    path = decision.path
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in layers:
            return layers[path]
    return None


def summarize(decisions):
    """One line per (kind, fused, reason), with how many modules share it; fused modules inside a
    fused whole layer are counted apart, as its fallback."""
    layers = {d.path: d.kind for d in decisions if d.fused and d.kind in WHOLE_LAYER}
    counts = {}
    for d in decisions:
        reason = d.reason
        enclosing = _enclosing_layer(d, layers) if d.fused else None
        if enclosing is not None:
            reason += f" (inside a fused {enclosing}: runs where a call cannot take the {enclosing} op)"
        key = (d.kind, d.fused, reason)
        counts[key] = counts.get(key, 0) + 1
    lines = []
    for (kind, fused, reason), n in counts.items():
        lines.append(f"{'fused' if fused else 'kept '} {n:3d} x {kind}: {reason}")
    return "\n".join(lines)
