"""fusekit's operators as PyTorch functions with autograd.

Loads the operator library (torch_ops/, see fusekit.library), registers for each forward op a fake
implementation (shapes only, for torch.compile and meta tensors) and an autograd formula that calls
the op's backward, and offers the functions users call. No kernels here: every computation is one
of the library's CUDA ops.

Dropout: each call with p > 0 draws its Philox (seed, offset) from PyTorch's generator, so
torch.manual_seed makes runs reproducible; the backward regenerates the same mask from them. Eager
calls draw them on the CPU; calls traced by torch.compile draw them on the data's CUDA device, so
that the compiled graph holds no host tensor (Inductor would compile a C++ kernel for a CPU draw,
and a CUDA graph cannot hold one): the kernels then read the offset from device memory, under a
fixed key (torch_ops/tensor_checks.h's philox_of).

Autograd: FUSEKIT_TORCH_AUTOGRAD=cpp (the default) registers the formulas written in C++
(torch_ops/autograd.cpp) for every op but linear; =python registers the formulas below with
torch.library for all of them. Both pass the same tests; the C++ formulas spare each call the
Python work (PyTorch's profiler on the H100: about 100 us of host time per backward node of a
Python formula), which decides a patched model's eager step, host-bound at BERT-base sizes. An op
takes one of the two for the life of the process.
"""

import ctypes
import os

import torch

from fusekit.library import find_library, missing

AUTOGRAD = os.environ.get("FUSEKIT_TORCH_AUTOGRAD", "cpp")
if AUTOGRAD not in ("python", "cpp"):
    raise ImportError(f"fusekit.ops: FUSEKIT_TORCH_AUTOGRAD must be python or cpp, not {AUTOGRAD!r}")

_path = find_library()
if _path is None:
    raise ImportError("fusekit.ops: " + "; ".join(missing()))
torch.ops.load_library(_path)

_ops = torch.ops.fusekit
_float = torch.float32

# Inductor's implicit-fallback log line would print each fusekit op's inputs as whole IR trees
# (fusekit.inductor): bounded before any model is compiled.
try:
    import torch._inductor.exc as _inductor_exc
except Exception:  # a PyTorch without Inductor compiles nothing
    _inductor_exc = None
if _inductor_exc is not None:
    from fusekit.inductor import bound_fallback_log

    try:
        bound_fallback_log(_inductor_exc)
    except Exception:  # it only shortens a log line: never a reason not to load the ops
        pass


# torch.compiler.is_compiling (PyTorch 2.3 and later), which Dynamo evaluates to True while tracing.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def philox(p, like=None):
    """The (seed, offset) of one dropout call: drawn from PyTorch's generator when p > 0; on the
    CPU, or on like's CUDA device while torch.compile traces the call (the op reads it there)."""
    compiling = _is_compiling is not None and _is_compiling()
    device = like.device if compiling and like is not None and like.is_cuda else "cpu"
    if p > 0:
        return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)
    return torch.zeros(2, dtype=torch.int64, device=device)


def _rows(x):
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


# ---- fake implementations: shapes and dtypes only


@torch.library.register_fake("fusekit::layernorm")
def _(x, gamma, beta, eps):
    rows = _rows(x)
    return torch.empty_like(x), x.new_empty((rows,), dtype=_float), x.new_empty((rows,), dtype=_float)


@torch.library.register_fake("fusekit::layernorm_backward")
def _(dy, x, gamma, mean, rstd):
    return torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(gamma)


@torch.library.register_fake("fusekit::bias_gelu")
def _(x, bias, approximate):
    return torch.empty_like(x)


@torch.library.register_fake("fusekit::bias_gelu_backward")
def _(dy, x, bias, approximate):
    return torch.empty_like(x), torch.empty_like(bias)


@torch.library.register_fake("fusekit::bias_dropout_residual_layernorm")
def _(x, bias, residual, gamma, beta, p, philox, eps):
    rows = _rows(x)
    return torch.empty_like(x), x.new_empty((rows,), dtype=_float), x.new_empty((rows,), dtype=_float)


@torch.library.register_fake("fusekit::bias_dropout_residual_layernorm_backward")
def _(dy, x, bias, residual, gamma, mean, rstd, p, philox):
    return (torch.empty_like(x), torch.empty_like(x), torch.empty_like(bias), torch.empty_like(gamma),
            torch.empty_like(gamma))


@torch.library.register_fake("fusekit::embedding_layernorm")
def _(word_ids, position_ids, token_type_ids, word, position, token_type, gamma, beta, p, philox, eps, padding_idx):
    tokens = word_ids.numel()
    y = word.new_empty((*word_ids.shape, word.shape[1]))
    return y, word.new_empty((tokens,), dtype=_float), word.new_empty((tokens,), dtype=_float)


@torch.library.register_fake("fusekit::embedding_layernorm_backward")
def _(dy, word_ids, position_ids, token_type_ids, word, position, token_type, gamma, mean, rstd, p, philox,
      padding_idx):
    return (torch.empty_like(word), torch.empty_like(position), torch.empty_like(token_type),
            torch.empty_like(gamma), torch.empty_like(gamma))


@torch.library.register_fake("fusekit::bert_attention")
def _(qkv, lengths, scale, p, philox):
    batch, seq, _, heads, head_dim = qkv.shape
    return qkv.new_empty((batch, seq, heads * head_dim)), qkv.new_empty((batch, heads, seq), dtype=_float)


@torch.library.register_fake("fusekit::bert_attention_backward")
def _(dout, qkv, lengths, out, lse, scale, p, philox):
    return torch.empty_like(qkv)


def _bert_layer_saved_shapes(x, params, heads):
    """The shapes and dtypes of bert_layer's `saved` (torch_ops/bert_layer.cpp's order)."""
    batch, seq, hidden = x.shape
    tokens, inner = batch * seq, params[10].shape[0]
    packed = sum(p.numel() for p in params)
    half, f = x.dtype, _float
    return [((packed,), half), ((batch, seq, 3, heads, hidden // heads), half), ((batch, seq, hidden), half),
            ((batch, heads, seq), f), ((tokens, hidden), half), ((tokens, hidden), half), ((tokens,), f),
            ((tokens,), f), ((tokens, inner), half), ((tokens, inner), half), ((tokens, hidden), half),
            ((tokens,), f), ((tokens,), f)]


@torch.library.register_fake("fusekit::bert_layer")
def _(x, lengths, params, heads, scale, p_attention, p_attention_output, p_output, philox, eps, approximate):
    saved = [x.new_empty(shape, dtype=dtype) for shape, dtype in _bert_layer_saved_shapes(x, params, heads)]
    return torch.empty_like(x), saved


@torch.library.register_fake("fusekit::bert_layer_backward")
def _(dy, x, lengths, params, saved, heads, scale, p_attention, p_attention_output, p_output, philox, approximate):
    return torch.empty_like(x), [torch.empty_like(p) for p in params]


@torch.library.register_fake("fusekit::swin_block")
def _(x, params, index, mask, drop1, drop2, dtype, window, shift, heads, scale, eps1, eps2, approximate):
    batch, height, width, channels = x.shape
    tokens, n = batch * height * width, window * window
    windows = tokens // n
    features = params[9].shape[0]
    norms = sum(params[k].numel() for k in (0, 1, 7, 8))
    packed = sum(params[k].numel() for k in range(13)) - norms
    f = _float
    shapes = [((norms,), x.dtype), ((packed,), dtype), ((windows, n, channels), dtype), ((tokens,), f), ((tokens,), f),
              ((windows, n, 3, heads, channels // heads), dtype), ((windows, n, channels), dtype),
              ((heads, n, n), f), ((windows, heads, n), f), (tuple(x.shape), x.dtype), ((tokens,), f),
              ((tokens,), f), ((tokens, channels), dtype), ((tokens, features), dtype), ((tokens, features), dtype)]
    return torch.empty_like(x), [x.new_empty(shape, dtype=t) for shape, t in shapes]


@torch.library.register_fake("fusekit::swin_block_backward")
def _(dy, x, params, index, mask, drop1, drop2, saved, window, shift, heads, scale, approximate):
    return torch.empty_like(x), [torch.empty_like(p) for p in params]


@torch.library.register_fake("fusekit::cross_entropy")
def _(logits, labels, ignore_index, label_smoothing):
    return (logits.new_empty((), dtype=_float), logits.new_empty((logits.shape[0],), dtype=_float),
            logits.new_empty((1,), dtype=torch.int32))


@torch.library.register_fake("fusekit::cross_entropy_backward")
def _(dloss, logits, labels, lse, valid, ignore_index, label_smoothing):
    return torch.empty_like(logits)


@torch.library.register_fake("fusekit::window_partition")
def _(x, gamma, beta, window, shift, eps):
    batch, height, width, channels = x.shape
    tokens = batch * height * width
    windows = x.new_empty((batch * (height // window) * (width // window), window * window, channels))
    return windows, x.new_empty((tokens,), dtype=_float), x.new_empty((tokens,), dtype=_float)


@torch.library.register_fake("fusekit::window_partition_backward")
def _(dwindows, x, gamma, mean, rstd, window, shift):
    return torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(gamma)


@torch.library.register_fake("fusekit::window_merge")
def _(windows, shortcut, window, shift):
    return torch.empty_like(shortcut)


@torch.library.register_fake("fusekit::window_merge_backward")
def _(dy, window, shift):
    batch, height, width, channels = dy.shape
    return dy.new_empty((batch * (height // window) * (width // window), window * window, channels))


@torch.library.register_fake("fusekit::patch_merging")
def _(x, gamma, beta, eps):
    batch, height, width, channels = x.shape
    merged = batch * (height // 2) * (width // 2)
    y = x.new_empty((batch, height // 2, width // 2, 4 * channels))
    return y, x.new_empty((merged,), dtype=_float), x.new_empty((merged,), dtype=_float)


@torch.library.register_fake("fusekit::patch_merging_backward")
def _(dy, x, gamma, mean, rstd):
    return torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(gamma)


@torch.library.register_fake("fusekit::window_attention")
def _(qkv, table, index, mask, scale):
    windows, tokens, _, heads, head_dim = qkv.shape
    return (qkv.new_empty((windows, tokens, heads * head_dim)), qkv.new_empty((heads, tokens, tokens), dtype=_float),
            qkv.new_empty((windows, heads, tokens), dtype=_float))


@torch.library.register_fake("fusekit::window_attention_backward")
def _(dout, qkv, table, index, mask, out, bias, lse, scale):
    return torch.empty_like(qkv), torch.empty_like(table)


@torch.library.register_fake("fusekit::linear")
def _(x, weight, bias, epilogue):
    y = x.new_empty((*x.shape[:-1], weight.shape[0]))
    return y, (torch.empty_like(y) if epilogue == "bias_gelu" else x.new_empty((0,)))


@torch.library.register_fake("fusekit::linear_backward")
def _(dy, x, weight, pre, epilogue):
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty((weight.shape[0],))


@torch.library.register_fake("fusekit::adamw_step_")
def _(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step):
    return None


@torch.library.register_fake("fusekit::softmax")
def _(x, scale, mask, lengths):
    return torch.empty_like(x)


@torch.library.register_fake("fusekit::softmax_backward")
def _(y, dy, scale):
    return torch.empty_like(y)


# ---- autograd: each forward op's backward is its _backward op


# The ops whose formulas torch_ops/autograd.cpp also has; the others take the Python formula in
# either mode.
CPP_AUTOGRAD_OPS = {"fusekit::layernorm", "fusekit::bias_gelu", "fusekit::bias_dropout_residual_layernorm",
                    "fusekit::embedding_layernorm", "fusekit::bert_attention", "fusekit::cross_entropy",
                    "fusekit::softmax", "fusekit::window_partition", "fusekit::window_merge",
                    "fusekit::patch_merging", "fusekit::window_attention", "fusekit::bert_layer",
                    "fusekit::swin_block"}


def _register_autograd(name, backward, setup_context):
    if AUTOGRAD == "python" or name not in CPP_AUTOGRAD_OPS:
        torch.library.register_autograd(name, backward, setup_context=setup_context)


if AUTOGRAD == "cpp":
    ctypes.CDLL(_path).fusekit_enable_cpp_autograd()


def _layernorm_setup(ctx, inputs, output):
    x, gamma, beta, eps = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, gamma, mean, rstd)


def _layernorm_backward(ctx, dy, _dmean, _drstd):
    x, gamma, mean, rstd = ctx.saved_tensors
    dx, dgamma, dbeta = _ops.layernorm_backward(dy.contiguous(), x, gamma, mean, rstd)
    return dx, dgamma, dbeta, None


_register_autograd("fusekit::layernorm", _layernorm_backward, setup_context=_layernorm_setup)


def _bias_gelu_setup(ctx, inputs, output):
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _bias_gelu_backward(ctx, dy):
    x, bias = ctx.saved_tensors
    dx, dbias = _ops.bias_gelu_backward(dy.contiguous(), x, bias, ctx.approximate)
    return dx, dbias, None


_register_autograd("fusekit::bias_gelu", _bias_gelu_backward, setup_context=_bias_gelu_setup)


def _bdrl_setup(ctx, inputs, output):
    x, bias, residual, gamma, beta, p, philox_, eps = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, bias, residual, gamma, mean, rstd, philox_)
    ctx.p = p


def _bdrl_backward(ctx, dy, _dmean, _drstd):
    x, bias, residual, gamma, mean, rstd, philox_ = ctx.saved_tensors
    dx, dresidual, dbias, dgamma, dbeta = _ops.bias_dropout_residual_layernorm_backward(
        dy.contiguous(), x, bias, residual, gamma, mean, rstd, ctx.p, philox_)
    return dx, dbias, dresidual, dgamma, dbeta, None, None, None


_register_autograd("fusekit::bias_dropout_residual_layernorm", _bdrl_backward, setup_context=_bdrl_setup)


def _embedding_setup(ctx, inputs, output):
    word_ids, position_ids, token_type_ids, word, position, token_type, gamma, beta, p, philox_, eps, padding_idx = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(word_ids, position_ids, token_type_ids, word, position, token_type, gamma, mean, rstd,
                          philox_)
    ctx.p, ctx.padding_idx = p, padding_idx


def _embedding_backward(ctx, dy, _dmean, _drstd):
    word_ids, position_ids, token_type_ids, word, position, token_type, gamma, mean, rstd, philox_ = ctx.saved_tensors
    dword, dposition, dtoken_type, dgamma, dbeta = _ops.embedding_layernorm_backward(
        dy.contiguous(), word_ids, position_ids, token_type_ids, word, position, token_type, gamma, mean, rstd,
        ctx.p, philox_, ctx.padding_idx)
    return None, None, None, dword, dposition, dtoken_type, dgamma, dbeta, None, None, None, None


_register_autograd("fusekit::embedding_layernorm", _embedding_backward, setup_context=_embedding_setup)


def _attention_setup(ctx, inputs, output):
    qkv, lengths, scale, p, philox_ = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(qkv, lengths, out, lse, philox_)
    ctx.scale, ctx.p = scale, p


def _attention_backward(ctx, dout, _dlse):
    qkv, lengths, out, lse, philox_ = ctx.saved_tensors
    dqkv = _ops.bert_attention_backward(dout.contiguous(), qkv, lengths, out, lse, ctx.scale, ctx.p, philox_)
    return dqkv, None, None, None, None


_register_autograd("fusekit::bert_attention", _attention_backward, setup_context=_attention_setup)


def _bert_layer_setup(ctx, inputs, output):
    x, lengths, params, heads, scale, p_attention, p_attention_output, p_output, philox_, eps, approximate = inputs
    y, saved = output
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs
    ctx.save_for_backward(x, lengths, philox_, *params, *saved)
    ctx.params = len(params)
    ctx.args = (heads, scale, p_attention, p_attention_output, p_output)
    ctx.approximate = approximate


def _bert_layer_backward(ctx, dy, _dsaved):
    if dy is None:  # the structure of the inputs: the params as a list
        return (None, None, [None] * ctx.params) + (None,) * 8
    x, lengths, philox_, *rest = ctx.saved_tensors
    params, saved = rest[:ctx.params], rest[ctx.params:]
    dx, dparams = _ops.bert_layer_backward(dy.contiguous(), x, lengths, params, saved, *ctx.args, philox_,
                                           ctx.approximate)
    return dx, None, list(dparams), None, None, None, None, None, None, None, None


_register_autograd("fusekit::bert_layer", _bert_layer_backward, setup_context=_bert_layer_setup)


def _swin_block_setup(ctx, inputs, output):
    x, params, index, mask, drop1, drop2, dtype, window, shift, heads, scale, eps1, eps2, approximate = inputs
    y, saved = output
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, index, mask, drop1, drop2, *params, *saved)
    ctx.params = len(params)
    ctx.args = (window, shift, heads, scale, approximate)


def _swin_block_backward(ctx, dy, _dsaved):
    if dy is None:
        return (None, [None] * ctx.params) + (None,) * 12
    x, index, mask, drop1, drop2, *rest = ctx.saved_tensors
    params, saved = rest[:ctx.params], rest[ctx.params:]
    dx, dparams = _ops.swin_block_backward(dy.contiguous(), x, params, index, mask, drop1, drop2, saved, *ctx.args)
    return (dx, list(dparams)) + (None,) * 12


_register_autograd("fusekit::swin_block", _swin_block_backward, setup_context=_swin_block_setup)


def _cross_entropy_setup(ctx, inputs, output):
    logits, labels, ignore_index, label_smoothing = inputs
    loss, lse, valid = output
    ctx.mark_non_differentiable(lse, valid)
    ctx.save_for_backward(logits, labels, lse, valid)
    ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing


def _cross_entropy_backward(ctx, dloss, _dlse, _dvalid):
    logits, labels, lse, valid = ctx.saved_tensors
    dlogits = _ops.cross_entropy_backward(dloss.to(_float).reshape(1).contiguous(), logits, labels, lse, valid,
                                          ctx.ignore_index, ctx.label_smoothing)
    return dlogits, None, None, None


_register_autograd("fusekit::cross_entropy", _cross_entropy_backward, setup_context=_cross_entropy_setup)


def _softmax_setup(ctx, inputs, output):
    x, scale, mask, lengths = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _ops.softmax_backward(y, dy.contiguous(), ctx.scale), None, None, None


_register_autograd("fusekit::softmax", _softmax_backward, setup_context=_softmax_setup)


def _partition_setup(ctx, inputs, output):
    x, gamma, beta, window, shift, eps = inputs
    windows, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, gamma, mean, rstd)
    ctx.window, ctx.shift = window, shift


def _partition_backward(ctx, dwindows, _dmean, _drstd):
    x, gamma, mean, rstd = ctx.saved_tensors
    dx, dgamma, dbeta = _ops.window_partition_backward(dwindows.contiguous(), x, gamma, mean, rstd, ctx.window,
                                                       ctx.shift)
    return dx, dgamma, dbeta, None, None, None


_register_autograd("fusekit::window_partition", _partition_backward, setup_context=_partition_setup)


def _merge_setup(ctx, inputs, output):
    windows, shortcut, window, shift = inputs
    ctx.window, ctx.shift = window, shift


def _merge_backward(ctx, dy):
    dy = dy.contiguous()
    return _ops.window_merge_backward(dy, ctx.window, ctx.shift), dy, None, None


_register_autograd("fusekit::window_merge", _merge_backward, setup_context=_merge_setup)


def _patch_setup(ctx, inputs, output):
    x, gamma, beta, eps = inputs
    y, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, gamma, mean, rstd)


def _patch_backward(ctx, dy, _dmean, _drstd):
    x, gamma, mean, rstd = ctx.saved_tensors
    dx, dgamma, dbeta = _ops.patch_merging_backward(dy.contiguous(), x, gamma, mean, rstd)
    return dx, dgamma, dbeta, None


_register_autograd("fusekit::patch_merging", _patch_backward, setup_context=_patch_setup)


def _window_attention_setup(ctx, inputs, output):
    qkv, table, index, mask, scale = inputs
    out, bias, lse = output
    ctx.mark_non_differentiable(bias, lse)
    ctx.save_for_backward(qkv, table, index, mask, out, bias, lse)
    ctx.scale = scale


def _window_attention_backward(ctx, dout, _dbias, _dlse):
    qkv, table, index, mask, out, bias, lse = ctx.saved_tensors
    dqkv, dtable = _ops.window_attention_backward(dout.contiguous(), qkv, table, index, mask, out, bias, lse,
                                                  ctx.scale)
    return dqkv, dtable, None, None, None


_register_autograd("fusekit::window_attention", _window_attention_backward, setup_context=_window_attention_setup)


def _linear_setup(ctx, inputs, output):
    x, weight, bias, epilogue = inputs
    y, pre = output
    ctx.mark_non_differentiable(pre)
    ctx.save_for_backward(x, weight, pre)
    ctx.epilogue = epilogue


def _linear_backward(ctx, dy, _dpre):
    x, weight, pre = ctx.saved_tensors
    dx, dweight, dbias = _ops.linear_backward(dy.contiguous(), x, weight, pre, ctx.epilogue)
    return dx, dweight, dbias, None


_register_autograd("fusekit::linear", _linear_backward, setup_context=_linear_setup)


# ---- what users call


def layer_norm(x, weight, bias, eps=1e-5):
    """torch.nn.functional.layer_norm over the last dimension."""
    return _ops.layernorm(x.contiguous(), weight, bias, eps)[0]


def bias_gelu(x, bias, approximate="none"):
    """gelu(x + bias), as torch.nn.functional.gelu(x + bias, approximate=approximate)."""
    return _ops.bias_gelu(x.contiguous(), bias, approximate)


def bias_dropout_residual_layer_norm(x, bias, residual, weight, norm_bias, p=0.0, eps=1e-5):
    """layer_norm(residual + dropout(x + bias, p)): BERT's post-LN sublayer output."""
    return _ops.bias_dropout_residual_layernorm(x.contiguous(), bias, residual.contiguous(), weight, norm_bias, p,
                                                philox(p, x), eps)[0]


def embedding_layer_norm(word_ids, position_ids, token_type_ids, word, position, token_type, weight, bias, p=0.0,
                         eps=1e-12, padding_idx=None):
    """dropout(layer_norm(word[word_ids] + position[position_ids] + token_type[token_type_ids]), p);
    the word table's row padding_idx gets no gradient (as nn.Embedding's padding_idx)."""
    return _ops.embedding_layernorm(word_ids.contiguous(), position_ids.contiguous(), token_type_ids.contiguous(),
                                    word, position, token_type, weight, bias, p, philox(p, word), eps,
                                    -1 if padding_idx is None else padding_idx)[0]


def bert_attention(qkv, lengths, scale, p=0.0):
    """Attention over qkv [batch, seq, 3, heads, head_dim] with keys >= lengths[b] masked and
    dropout p on the probabilities: [batch, seq, heads * head_dim]."""
    return _ops.bert_attention(qkv.contiguous(), lengths, scale, p, philox(p, qkv))[0]


def bert_layer(x, lengths, params, heads, scale, p_attention=0.0, p_attention_output=0.0, p_output=0.0, eps=1e-12,
               approximate="none"):
    """A whole post-LN BERT encoder layer (Hugging Face's BertLayer) as one op: x [batch, seq, hidden]
    in float16 or bfloat16, lengths int32 [batch] (valid keys, padding on the right), params the
    layer's 16 tensors in torch_ops/bert_layer.cpp's order (query, key, value weight and bias,
    attention output dense and LayerNorm, intermediate dense, output dense and LayerNorm), any
    floating dtype: cast once inside, gradients returned in their own dtype. One Philox draw for the
    three dropout sites."""
    p = max(p_attention, p_attention_output, p_output)
    return _ops.bert_layer(x.contiguous(), lengths, list(params), heads, scale, p_attention, p_attention_output,
                           p_output, philox(p, x), eps, approximate)[0]


def swin_block(x, params, index, mask, dtype, window, shift, heads, scale, eps1=1e-5, eps2=1e-5, approximate="none",
               drop1=None, drop2=None):
    """A whole Swin Transformer block (timm's SwinTransformerBlock, no dropout) as one op: x [B, H,
    W, C] in the residual stream's dtype, dtype the compute dtype (float16 or bfloat16), params the
    block's 13 tensors in torch_ops/swin_block.cpp's order (norm1, qkv, the relative position bias
    table, proj, norm2, fc1, fc2), any floating dtype; index int32 [N, N]; mask float32 [windows per
    image, N, N] or None; drop1, drop2: stochastic depth of the attention and MLP branch as per-sample
    scales ([B], 0 or 1 / keep; converted to float32) or None."""
    drop1 = None if drop1 is None else drop1.float().contiguous()
    drop2 = None if drop2 is None else drop2.float().contiguous()
    return _ops.swin_block(x.contiguous(), list(params), index, mask, drop1, drop2, dtype, window, shift, heads, scale,
                           eps1, eps2, approximate)[0]


def cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.0):
    """torch.nn.functional.cross_entropy(logits, labels, ignore_index=..., label_smoothing=...)
    with reduction "mean"; logits [rows, classes] in any float dtype (no float32 copy is made).
    Where every label is ignored the loss is 0 (PyTorch: NaN)."""
    return _ops.cross_entropy(logits.contiguous(), labels.contiguous(), ignore_index, label_smoothing)[0]


def softmax(x, scale=1.0, mask="none", lengths=None):
    """softmax(scale * x) over the last dimension of [batch, heads, queries, keys] with a "none",
    "causal" or "padding" (keys >= lengths[b]) mask."""
    return _ops.softmax(x.contiguous(), scale, mask, lengths)


def window_partition(x, weight, bias, window, shift=0, eps=1e-5):
    """Swin's layer_norm(x), torch.roll by (-shift, -shift) and window partition in one kernel:
    x [B, H, W, C] -> windows [B * nW, window * window, C]."""
    return _ops.window_partition(x.contiguous(), weight, bias, window, shift, eps)[0]


def window_merge(windows, shortcut, window, shift=0):
    """shortcut + torch.roll(window_reverse(windows), (shift, shift)): [B, H, W, C]."""
    return _ops.window_merge(windows.contiguous(), shortcut.contiguous(), window, shift)


def patch_merging(x, weight, bias, eps=1e-5):
    """Swin's PatchMerging gather (x0, x1, x2, x3 of each 2x2 patch) and layer_norm over 4C:
    [B, H, W, C] -> [B, H/2, W/2, 4C] (the reduction GEMM is the caller's)."""
    return _ops.patch_merging(x.contiguous(), weight, bias, eps)[0]


def window_attention(qkv, table, index, mask, scale):
    """softmax(scale q k^T + table[index] + mask) v per window and head: qkv [windows, tokens, 3,
    heads, head_dim], index int32 [tokens, tokens], mask float32 [mask windows, tokens, tokens] or
    None -> [windows, tokens, heads * head_dim]."""
    return _ops.window_attention(qkv.contiguous(), table, index, mask, scale)[0]


def adamw_step_(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step, in place, over lists of float32 CUDA tensors (torch.optim.AdamW's arithmetic);
    `step` counts from 1. fusekit.torch.AdamW is the optimizer built on it."""
    _ops.adamw_step_(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step)


def linear(x, weight, bias, epilogue="bias"):
    """torch.nn.functional.linear(x, weight, bias) as one cuBLASLt GEMM with its epilogue; with
    epilogue "bias_gelu", gelu(...) in the tanh form (approximate="tanh") fused into the GEMM."""
    return _ops.linear(x.contiguous(), weight, bias, epilogue)[0]
