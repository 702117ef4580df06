"""fusekit's torch.ops on the GPU (pytest): every op against PyTorch's own composition of the same
math, forward and backward through autograd, in float32, float16 and bfloat16 on fresh random
inputs with odd shapes; torch.library.opcheck on every op (schema, fake implementation, autograd
registration, AOT dispatch); dropout reproducible under torch.manual_seed, eager and compiled (the
compiled draw on the device); bad input raises one clear exception.

Tolerances: relative Frobenius error against a float64 evaluation of the PyTorch composition, at
most twice the error of the same composition run by PyTorch in the tested dtype, plus the
DESIGN.md bound for that dtype as a floor (fp32 1e-5, fp16 2e-3, bf16 1e-2).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import fusekit.ops as fk

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HALF = [torch.float16, torch.bfloat16]
FLOOR = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DEVICE = "cuda"


def relative_error(out, ref, floor=1e-30):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out - ref).norm() / ref.norm().clamp_min(floor)).item()


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def compare(fused_fn, torch_fn, inputs, dtype, grad_seed=7, floored=()):
    """Runs fused_fn and torch_fn (a PyTorch composition) on copies of `inputs` (the float ones
    require grad), in dtype and float64; checks the output and every input gradient. `floored`:
    indices of inputs whose gradient is zero in exact arithmetic (a key projection's bias: softmax
    ignores a constant added to a row of scores), measured against 1e-3 of the mean gradient norm
    instead of their own norm, which is rounding noise."""
    floats = [i for i, t in enumerate(inputs) if t.is_floating_point()]

    def run(fn, cast):
        args = [leaf(t.to(cast)) if i in floats else t for i, t in enumerate(inputs)]
        out = fn(*args)
        g = torch.Generator(device=DEVICE).manual_seed(grad_seed)
        dout = torch.randn(out.shape, generator=g, device=DEVICE, dtype=torch.float32).to(out.dtype)
        out.backward(dout)
        return out.detach(), [args[i].grad for i in floats]

    ref_out, ref_grads = run(torch_fn, torch.float64)
    base_out, base_grads = run(torch_fn, dtype)
    out, grads = run(fused_fn, dtype)
    checks = [("output", out, base_out, ref_out, 1e-30)]
    mean_norm = sum(g.double().norm().item() for g in ref_grads) / max(len(ref_grads), 1)
    for i, g, bg, rg in zip(floats, grads, base_grads, ref_grads):
        checks.append((f"grad of input {i}", g, bg, rg, 1e-3 * mean_norm if i in floored else 1e-30))
    for name, value, baseline, reference, floor in checks:
        assert value is not None, f"{name}: no gradient"
        bound = max(2 * relative_error(baseline, reference, floor), FLOOR[dtype])
        error = relative_error(value, reference, floor)
        assert error <= bound, f"{name}: error {error:.3g} > {bound:.3g} ({dtype})"


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,columns", [(1, 768), (37, 1023), (301, 96)])
def test_layernorm(dtype, rows, columns):
    x, w, b = randn(rows, columns), randn(columns) * 0.1 + 1, randn(columns) * 0.1
    compare(lambda x, w, b: fk.layer_norm(x, w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (columns,), w, b, 1e-5), [x, w, b], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("rows,columns", [(3, 3072), (129, 1000)])
def test_bias_gelu(dtype, approximate, rows, columns):
    x, b = randn(rows, columns), randn(columns)
    compare(lambda x, b: fk.bias_gelu(x, b, approximate),
            lambda x, b: F.gelu(x + b, approximate=approximate), [x, b], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,columns", [(5, 768), (257, 1001)])
def test_bias_dropout_residual_layernorm_without_dropout(dtype, rows, columns):
    x, b, r = randn(rows, columns), randn(columns), randn(rows, columns)
    w, nb = randn(columns) * 0.1 + 1, randn(columns) * 0.1
    compare(lambda x, b, r, w, nb: fk.bias_dropout_residual_layer_norm(x, b, r, w, nb, 0.0, 1e-5),
            lambda x, b, r, w, nb: F.layer_norm(r + x + b, (columns,), w, nb, 1e-5), [x, b, r, w, nb], dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_bias_dropout_residual_layernorm_with_dropout(dtype):
    """The mask the op applied, recovered from a run with x = 1 and bias = 0 (kept elements hold
    1 / (1 - p), dropped ones 0), makes the PyTorch composition equal to the op."""
    rows, columns, p = 300, 768, 0.1
    x, b, r = randn(rows, columns), randn(columns), randn(rows, columns)
    w, nb = randn(columns) * 0.1 + 1, randn(columns) * 0.1
    ones = torch.ones(rows, columns, device=DEVICE, dtype=dtype)
    zeros = torch.zeros(columns, device=DEVICE, dtype=dtype)
    philox = torch.tensor([1234, 0], dtype=torch.int64)
    ops = torch.ops.fusekit
    # With residual 0, gamma 1 and beta 0, y is LayerNorm(mask / (1 - p)): mask from its sign.
    probe, _, _ = ops.bias_dropout_residual_layernorm(ones, zeros, torch.zeros_like(ones), torch.ones_like(zeros),
                                                      zeros, p, philox, 1e-5)
    row_mean = probe.float().mean(-1, keepdim=True)
    mask = (probe.float() > row_mean).to(torch.float64) / (1 - p)
    kept = mask.gt(0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.01, f"kept fraction {kept}"
    compare(lambda x, b, r, w, nb: ops.bias_dropout_residual_layernorm(x, b, r, w, nb, p, philox, 1e-5)[0],
            lambda x, b, r, w, nb: F.layer_norm(r + (x + b) * mask.to(x.dtype), (columns,), w, nb, 1e-5),
            [x, b, r, w, nb], dtype)


def test_dropout_follows_torch_manual_seed():
    x, b, r = randn(64, 768, dtype=torch.float16), randn(768, dtype=torch.float16), randn(64, 768, dtype=torch.float16)
    w, nb = torch.ones(768, device=DEVICE, dtype=torch.float16), torch.zeros(768, device=DEVICE, dtype=torch.float16)
    torch.manual_seed(5)
    a = fk.bias_dropout_residual_layer_norm(x, b, r, w, nb, 0.1)
    torch.manual_seed(5)
    a2 = fk.bias_dropout_residual_layer_norm(x, b, r, w, nb, 0.1)
    c = fk.bias_dropout_residual_layer_norm(x, b, r, w, nb, 0.1)
    assert torch.equal(a, a2)
    assert not torch.equal(a, c)


# torch_ops/tensor_checks.h's kDevicePhiloxKey: the key of every call whose philox is on the device.
DEVICE_PHILOX_KEY = 0x66757365_6B697421


def test_device_philox_reads_the_offset_on_the_device():
    """philox on the data's device: the kernels read the offset (element 1) from device memory under
    the fixed device key, so it draws exactly the mask of (key, offset) given on the CPU, forward and
    backward; another offset another mask."""
    h = torch.float16
    x, b, r = randn(37, 768, dtype=h), randn(768, dtype=h), randn(37, 768, dtype=h)
    w, nb = randn(768, dtype=h), randn(768, dtype=h)
    qkv, lengths = randn(2, 50, 3, 2, 64, dtype=h), torch.tensor([50, 21], dtype=torch.int32, device=DEVICE)
    ops = torch.ops.fusekit

    def run(philox):
        xs = [leaf(t) for t in (x, b, r, w, nb)]
        y = ops.bias_dropout_residual_layernorm(*xs, 0.1, philox, 1e-5)[0]
        y.float().square().sum().backward()
        q = leaf(qkv)
        out = ops.bert_attention(q, lengths, 0.125, 0.1, philox)[0]
        out.float().square().sum().backward()
        return [y.detach(), out.detach(), q.grad] + [t.grad for t in xs]

    on_cpu = run(torch.tensor([DEVICE_PHILOX_KEY, 12345], dtype=torch.int64))
    on_device = run(torch.tensor([7, 12345], dtype=torch.int64, device=DEVICE))  # element 0 unused there
    other = run(torch.tensor([7, 12346], dtype=torch.int64, device=DEVICE))
    assert torch.equal(on_cpu[0], on_device[0]) and torch.equal(on_cpu[1], on_device[1])
    assert torch.equal(on_cpu[2], on_device[2])  # the attention's backward: no atomics
    for a, c in zip(on_cpu[3:], on_device[3:]):
        assert relative_error(c, a) < 2e-3  # the parameter gradients sum with atomics
    assert not torch.equal(on_cpu[0], other[0]) and not torch.equal(on_cpu[1], other[1])
    # Read when the kernel runs: captured in a CUDA graph, a replay after the offset changed on the
    # device draws the new offset's mask.
    philox = torch.tensor([7, 12345], dtype=torch.int64, device=DEVICE)
    xs = [t.clone() for t in (x, b, r, w, nb)]
    ops.bias_dropout_residual_layernorm(*xs, 0.1, philox, 1e-5)  # warm-up, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.bias_dropout_residual_layernorm(*xs, 0.1, philox, 1e-5)[0]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, on_cpu[0])
    philox[1] = 12346
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, other[0]), "the replay did not read the new offset"
    with pytest.raises(ValueError, match="philox must be an int64 tensor of 2 elements"):
        ops.bias_dropout_residual_layernorm(x, b, r, w, nb, 0.1, torch.zeros(3, dtype=torch.int64, device=DEVICE),
                                            1e-5)


def test_compiled_dropout_draws_on_the_device_and_follows_torch_manual_seed():
    """Under torch.compile the draw happens on the device (no host tensor in the graph): the
    compiled function and its backward run, draw a fresh mask per call, torch.manual_seed repeats
    them, and the backward applies the forward's mask (with x = 1, bias 0, residual 0, gamma 1 and
    beta 0 the output's sign shows the mask, and the gradient of sum(y * g) with respect to x is
    zero exactly where it dropped)."""
    h = torch.float16
    ones = torch.ones(64, 768, device=DEVICE, dtype=h)
    zeros = torch.zeros(768, device=DEVICE, dtype=h)
    g = randn(64, 768, dtype=h)

    def step(x):
        y = fk.bias_dropout_residual_layer_norm(x, zeros, torch.zeros_like(ones), torch.ones_like(zeros), zeros, 0.1)
        (y.float() * g.float()).sum().backward()
        return y.detach()

    compiled = torch.compile(step)
    torch.manual_seed(5)
    x1, x2 = leaf(ones), leaf(ones)
    a, c = compiled(x1), compiled(x2)
    torch.manual_seed(5)
    x3 = leaf(ones)
    a2 = compiled(x3)
    assert torch.isfinite(a.float()).all() and torch.isfinite(x1.grad.float()).all()
    assert torch.equal(a, a2) and torch.equal(x1.grad, x3.grad)
    assert not torch.equal(a, c)
    dropped = a.float() < a.float().mean(-1, keepdim=True)  # LayerNorm of mask / (1 - p)
    assert 0.05 < dropped.float().mean().item() < 0.15
    assert torch.equal(x1.grad[dropped], torch.zeros_like(x1.grad[dropped])), "backward kept a dropped element"
    assert (x1.grad[~dropped] != 0).float().mean().item() > 0.99, "backward dropped a kept element"


def test_inductor_names_fusekit_ops_without_printing_their_inputs():
    """fusekit.inductor: Inductor's implicit-fallback log line names a fusekit op instead of printing
    its inputs' IR trees (whose printing grew with a patched BERT's depth: 12 layers did not compile
    in 350 s); other operators keep PyTorch's text."""
    import torch._inductor.exc as exc

    class Unprintable:
        def __str__(self):
            raise AssertionError("printed")

    line = exc.MissingOperatorWithoutDecomp.operator_str(torch.ops.fusekit.layernorm.default, (Unprintable(),), {})
    assert "fusekit.layernorm" in line and "1 positional" in line
    assert "args[0]" in exc.MissingOperatorWithoutDecomp.operator_str(torch.ops.aten.add.Tensor, ("x", "y"), {})


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_layernorm(dtype):
    batch, seq, hidden, vocab, positions = 3, 37, 768, 1000, 64
    ids = torch.randint(0, vocab, (batch, seq), device=DEVICE)
    ids[0, :5] = 0  # the padding id
    pos = torch.arange(seq, device=DEVICE).expand(batch, seq)
    types = torch.randint(0, 2, (batch, seq), device=DEVICE)
    word, position, token_type = randn(vocab, hidden), randn(positions, hidden), randn(2, hidden)
    w, b = randn(hidden) * 0.1 + 1, randn(hidden) * 0.1

    def reference(word, position, token_type, w, b):
        e = F.embedding(ids, word, padding_idx=0) + F.embedding(pos, position) + F.embedding(types, token_type)
        return F.layer_norm(e, (hidden,), w, b, 1e-12)

    compare(lambda word, position, token_type, w, b: fk.embedding_layer_norm(ids, pos, types, word, position,
                                                                             token_type, w, b, 0.0, 1e-12, 0),
            reference, [word, position, token_type, w, b], dtype)


def attention_reference(qkv, lengths, scale):
    batch, seq, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [batch, heads, seq, head_dim]
    keep = torch.arange(seq, device=qkv.device)[None, :] < lengths[:, None].long()
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    out = torch.softmax(scores, -1) @ v
    return out.transpose(1, 2).reshape(batch, seq, heads * head_dim)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("seq,head_dim", [(128, 64), (77, 64), (200, 32), (64, 128)])
def test_bert_attention(dtype, seq, head_dim):
    batch, heads = 3, 4
    qkv = randn(batch, seq, 3, heads, head_dim)
    lengths = torch.tensor([seq, max(1, seq // 2), 1], dtype=torch.int32, device=DEVICE)
    scale = 1 / math.sqrt(head_dim)
    compare(lambda qkv: fk.bert_attention(qkv, lengths, scale, 0.0),
            lambda qkv: attention_reference(qkv, lengths, scale), [qkv], dtype)


def bert_layer_params(hidden, intermediate, dtype=torch.float32):
    """A BertLayer's 16 tensors (torch_ops/bert_layer.cpp's order), at the scale of a trained layer."""
    h, i = hidden, intermediate
    shapes = [(h, h), (h,), (h, h), (h,), (h, h), (h,), (h, h), (h,), (h,), (h,), (i, h), (i,), (h, i), (h,),
              (h,), (h,)]
    params = [randn(*s, scale=h ** -0.5 if len(s) == 2 else 0.1) for s in shapes]
    for k in (8, 14):  # LayerNorm gammas around 1
        params[k] = params[k] + 1
    return [p.to(dtype) for p in params]


def bert_layer_reference(x, lengths, heads, scale, eps, approximate, *params):
    """Hugging Face's BertLayer (post-LN) in PyTorch ops, in x's dtype, without dropout."""
    qw, qb, kw, kb, vw, vb, ow, ob, g1, b1, iw, ib, dw, db, g2, b2 = [p.to(x.dtype) for p in params]
    batch, seq, hidden = x.shape
    qkv = torch.stack([F.linear(x, qw, qb), F.linear(x, kw, kb), F.linear(x, vw, vb)], 2)
    context = attention_reference(qkv.view(batch, seq, 3, heads, hidden // heads), lengths, scale)
    a = F.layer_norm(x + F.linear(context, ow, ob), (hidden,), g1, b1, eps)
    up = F.gelu(F.linear(a, iw, ib), approximate=approximate)
    return F.layer_norm(a + F.linear(up, dw, db), (hidden,), g2, b2, eps)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("seq,heads,head_dim,inner,approximate",
                         [(128, 12, 64, 3072, "none"), (77, 3, 32, 200, "tanh"), (40, 2, 128, 512, "none")])
@pytest.mark.parametrize("master", ["float32", "same"])
def test_bert_layer(dtype, seq, heads, head_dim, inner, approximate, master):
    """The whole layer against its PyTorch composition: output, the input's and every parameter's
    gradient; parameters in float32 (autocast's case: cast inside, gradients returned in float32) or
    in the compute dtype."""
    batch, hidden = 3, heads * head_dim
    x = randn(batch, seq, hidden)
    lengths = torch.tensor([seq, max(1, seq // 3), 1], dtype=torch.int32, device=DEVICE)
    scale, eps = head_dim ** -0.5, 1e-12
    cast = (lambda p: p.float()) if master == "float32" else (lambda p: p)
    compare(lambda x, *p: fk.bert_layer(x, lengths, [cast(t) for t in p], heads, scale, eps=eps,
                                        approximate=approximate),
            lambda x, *p: bert_layer_reference(x, lengths, heads, scale, eps, approximate, *p),
            [x, *bert_layer_params(hidden, inner)], dtype, floored=(4,))  # input 4: the key bias


def test_bert_layer_dropout_follows_torch_manual_seed():
    x = randn(2, 64, 128, dtype=torch.float16)
    lengths = torch.tensor([64, 30], dtype=torch.int32, device=DEVICE)
    params = bert_layer_params(128, 256)

    def run(seed):
        torch.manual_seed(seed)
        return fk.bert_layer(x, lengths, params, 2, 0.125, 0.1, 0.1, 0.1)

    a, b, c = run(5), run(5), run(6)
    plain = fk.bert_layer(x, lengths, params, 2, 0.125)
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, plain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy(dtype, smoothing):
    rows, vocab = 300, 30522
    logits = randn(rows, vocab, scale=2.0)
    labels = torch.randint(0, vocab, (rows,), device=DEVICE)
    labels[::3] = -100
    compare(lambda x: fk.cross_entropy(x, labels, -100, smoothing),
            lambda x: F.cross_entropy(x.float() if x.dtype != torch.float64 else x, labels, ignore_index=-100,
                                      label_smoothing=smoothing), [logits], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
def test_softmax(dtype, mask):
    batch, heads, queries, keys = 2, 3, 33, 47
    x = randn(batch, heads, queries, keys)
    lengths = torch.tensor([keys, 9], dtype=torch.int32, device=DEVICE)

    def reference(x):
        z = x * 0.5
        keep = torch.ones(batch, 1, queries, keys, dtype=torch.bool, device=DEVICE)
        if mask == "causal":
            keep = keep & (torch.arange(keys, device=DEVICE)[None, :] <= torch.arange(queries, device=DEVICE)[:, None]
                           + keys - queries)
        if mask == "padding":
            keep = keep & (torch.arange(keys, device=DEVICE) < lengths[:, None, None, None])
        return torch.softmax(z.masked_fill(~keep, float("-inf")), -1)

    compare(lambda x: fk.softmax(x, 0.5, mask, lengths if mask == "padding" else None), reference, [x], dtype)


def swin_roll_partition(x, window, shift):
    """timm's torch.roll + window_partition: [B, H, W, C] -> [B * nW, window * window, C]."""
    b, h, w, c = x.shape
    if shift:
        x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    x = x.view(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def swin_reverse_roll(windows, b, h, w, window, shift):
    c = windows.shape[-1]
    x = windows.view(b, h // window, w // window, window, window, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
    return torch.roll(x, shifts=(shift, shift), dims=(1, 2)) if shift else x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 14, 14, 96, 7, 3), (1, 7, 21, 40, 7, 0), (3, 12, 12, 33, 6, 2)])
def test_window_partition(dtype, shape):
    b, h, w, c, window, shift = shape
    x, g, beta = randn(b, h, w, c), randn(c) * 0.1 + 1, randn(c) * 0.1
    compare(lambda x, g, beta: fk.window_partition(x, g, beta, window, shift, 1e-5),
            lambda x, g, beta: swin_roll_partition(F.layer_norm(x, (c,), g, beta, 1e-5), window, shift),
            [x, g, beta], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 14, 14, 96, 7, 3), (1, 7, 21, 40, 7, 0)])
def test_window_merge(dtype, shape):
    b, h, w, c, window, shift = shape
    windows, shortcut = randn(b * (h // window) * (w // window), window * window, c), randn(b, h, w, c)
    compare(lambda windows, shortcut: fk.window_merge(windows, shortcut, window, shift),
            lambda windows, shortcut: shortcut + swin_reverse_roll(windows, b, h, w, window, shift),
            [windows, shortcut], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 56, 56, 96), (1, 6, 10, 33)])
def test_patch_merging(dtype, shape):
    b, h, w, c = shape
    x, g, beta = randn(b, h, w, c), randn(4 * c) * 0.1 + 1, randn(4 * c) * 0.1

    def reference(x, g, beta):  # timm's PatchMerging before its reduction
        y = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return F.layer_norm(y, (4 * c,), g, beta, 1e-5)

    compare(lambda x, g, beta: fk.patch_merging(x, g, beta, 1e-5), reference, [x, g, beta], dtype)


def relative_position_index(window):
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
    return (relative[..., 0] * (2 * window - 1) + relative[..., 1]).to(torch.int32).to(DEVICE)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("window,heads,head_dim,masked", [(7, 3, 32, True), (7, 4, 64, False), (12, 2, 32, True)])
def test_window_attention(dtype, window, heads, head_dim, masked):
    tokens, windows, mask_windows = window * window, 12, 4
    qkv = randn(windows, tokens, 3, heads, head_dim)
    table = randn((2 * window - 1) ** 2, heads) * 0.1
    index = relative_position_index(window)
    mask = None
    if masked:
        mask = torch.where(torch.rand(mask_windows, tokens, tokens, device=DEVICE) < 0.3, -100.0, 0.0)
        mask[:, torch.arange(tokens), torch.arange(tokens)] = 0.0  # every row keeps a key
    scale = head_dim ** -0.5

    def reference(qkv, table):
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [windows, heads, tokens, head_dim]
        bias = table[index.long().view(-1)].view(tokens, tokens, heads).permute(2, 0, 1)
        s = (q @ k.transpose(-1, -2)) * scale + bias
        if mask is not None:
            s = (s.view(-1, mask_windows, heads, tokens, tokens) + mask[None, :, None].to(s.dtype)).view_as(s)
        return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(windows, tokens, heads * head_dim)

    compare(lambda qkv, table: fk.window_attention(qkv, table, index, mask, scale), reference, [qkv, table], dtype)


def window_attention_reference(qkv, table, index, mask, scale):
    windows, tokens, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [windows, heads, tokens, head_dim]
    bias = table[index.long().view(-1)].view(tokens, tokens, heads).permute(2, 0, 1)
    s = (q @ k.transpose(-1, -2)) * scale + bias
    if mask is not None:
        s = (s.view(-1, mask.shape[0], heads, tokens, tokens) + mask[None, :, None].to(s.dtype)).view_as(s)
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(windows, tokens, heads * head_dim)


def swin_block_params(channels, heads, window, features):
    c, f = channels, features
    shapes = [(c,), (c,), (3 * c, c), (3 * c,), ((2 * window - 1) ** 2, heads), (c, c), (c,), (c,), (c,), (f, c), (f,),
              (c, f), (c,)]
    params = [randn(*s, scale=s[1] ** -0.5 if len(s) == 2 and s[0] != (2 * window - 1) ** 2 else 0.1)
              for s in shapes]
    for k in (0, 7):  # LayerNorm gammas around 1
        params[k] = params[k] + 1
    return params


def swin_block_reference(x, index, mask, window, shift, heads, scale, *p, drops=(None, None)):
    """timm's SwinTransformerBlock in PyTorch ops (no dropout), in x's dtype; drops: the two
    branches' per-sample stochastic-depth scales, or None."""
    n1w, n1b, qw, qb, table, pw, pb, n2w, n2b, f1w, f1b, f2w, f2b = [t.to(x.dtype) for t in p]
    b, h, w, c = x.shape
    windows = swin_roll_partition(F.layer_norm(x, (c,), n1w, n1b, 1e-5), window, shift)
    qkv = F.linear(windows, qw, qb).view(windows.shape[0], window * window, 3, heads, c // heads)
    out = window_attention_reference(qkv, table, index, mask, scale)
    branch = swin_reverse_roll(F.linear(out, pw, pb), b, h, w, window, shift)
    if drops[0] is not None:
        branch = branch * drops[0].to(x.dtype)[:, None, None, None]
    y1 = x + branch
    branch = F.linear(F.gelu(F.linear(F.layer_norm(y1, (c,), n2w, n2b, 1e-5), f1w, f1b)), f2w, f2b)
    if drops[1] is not None:
        branch = branch * drops[1].to(x.dtype)[:, None, None, None]
    return y1 + branch


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(2, 14, 14, 96, 3, 3), (1, 7, 21, 64, 2, 0), (3, 14, 7, 128, 2, 3)])
@pytest.mark.parametrize("stream", ["float32", "same"])
def test_swin_block(dtype, shape, stream):
    """The whole block against its PyTorch composition: output, the input's and every parameter's
    gradient; the residual stream and the parameters in float32 (autocast's case) or in the compute
    dtype."""
    b, h, w, c, heads, shift = shape
    window, tokens = 7, 49
    x = randn(b, h, w, c)
    index = relative_position_index(window)
    mask = None
    if shift:
        mask = torch.where(torch.rand((h // window) * (w // window), tokens, tokens, device=DEVICE) < 0.3, -100.0, 0.0)
        mask[:, torch.arange(tokens), torch.arange(tokens)] = 0.0
    scale = (c // heads) ** -0.5
    up = (lambda t: t.float()) if stream == "float32" else (lambda t: t)
    compare(lambda x, *p: fk.swin_block(up(x), [up(t) for t in p], index, mask, dtype, window, shift, heads, scale),
            lambda x, *p: swin_block_reference(x, index, mask, window, shift, heads, scale, *p),
            [x, *swin_block_params(c, heads, window, 4 * c)], dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_swin_block_stochastic_depth(dtype):
    """Per-sample branch scales (timm's DropPath: 0 for a dropped sample, 1 / keep for a kept one)
    against the composition with the same scales; the float32 stream of autocast."""
    b, h, w, c, heads, shift, window = 3, 14, 14, 64, 2, 3, 7
    x, index = randn(b, h, w, c), relative_position_index(window)
    mask = torch.zeros((h // window) * (w // window), 49, 49, device=DEVICE)
    drops = (torch.tensor([0.0, 1 / 0.9, 1 / 0.9], device=DEVICE), torch.tensor([1 / 0.9, 0.0, 1 / 0.9], device=DEVICE))
    scale = (c // heads) ** -0.5
    compare(lambda x, *p: fk.swin_block(x.float(), [t.float() for t in p], index, mask, dtype, window, shift, heads,
                                        scale, drop1=drops[0], drop2=drops[1]),
            lambda x, *p: swin_block_reference(x, index, mask, window, shift, heads, scale, *p, drops=drops),
            [x, *swin_block_params(c, heads, window, 4 * c)], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("epilogue", ["bias", "bias_gelu"])
@pytest.mark.parametrize("m,n,k", [(8192, 3072, 768), (77, 64, 100), (1, 8, 3)])
def test_linear(dtype, epilogue, m, n, k):
    x, w, b = randn(m, k), randn(n, k) * k ** -0.5, randn(n)

    def reference(x, w, b):
        y = F.linear(x, w, b)
        return F.gelu(y, approximate="tanh") if epilogue == "bias_gelu" else y

    compare(lambda x, w, b: fk.linear(x, w, b, epilogue), reference, [x, w, b], dtype)


def opcheck_samples():
    h = torch.float16
    qkv = randn(2, 40, 3, 2, 64, dtype=h)
    lengths = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    x, b, r = randn(6, 96, dtype=h), randn(96, dtype=h), randn(6, 96, dtype=h)
    w, nb = randn(96, dtype=h), randn(96, dtype=h)
    philox = torch.tensor([99, 0], dtype=torch.int64)
    ids = torch.randint(0, 50, (2, 5), device=DEVICE)
    pos = torch.arange(5, device=DEVICE).expand(2, 5).contiguous()
    types = torch.zeros(2, 5, dtype=torch.int64, device=DEVICE)
    word, position, token_type = randn(50, 96, dtype=h), randn(8, 96, dtype=h), randn(2, 96, dtype=h)
    logits, labels = randn(7, 101, dtype=h), torch.randint(0, 101, (7,), device=DEVICE)
    scores = randn(2, 2, 5, 9, dtype=h)
    ops = torch.ops.fusekit
    return [
        (ops.layernorm, (leaf(x), leaf(w), leaf(nb), 1e-5)),
        (ops.bias_gelu, (leaf(x), leaf(b), "none")),
        (ops.bias_dropout_residual_layernorm, (leaf(x), leaf(b), leaf(r), leaf(w), leaf(nb), 0.1, philox, 1e-5)),
        (ops.embedding_layernorm, (ids, pos, types, leaf(word), leaf(position), leaf(token_type), leaf(w), leaf(nb),
                                   0.1, philox, 1e-12, 0)),
        (ops.bert_attention, (leaf(qkv), lengths, 0.125, 0.1, philox)),
        (ops.cross_entropy, (leaf(logits), labels, -100, 0.1)),
        (ops.softmax, (leaf(scores), 0.5, "none", None)),
        (ops.window_partition, (leaf(randn(2, 14, 14, 32, dtype=h)), leaf(randn(32, dtype=h)),
                                leaf(randn(32, dtype=h)), 7, 3, 1e-5)),
        (ops.window_merge, (leaf(randn(8, 49, 32, dtype=h)), leaf(randn(2, 14, 14, 32, dtype=h)), 7, 3)),
        (ops.patch_merging, (leaf(randn(2, 14, 14, 32, dtype=h)), leaf(randn(128, dtype=h)),
                             leaf(randn(128, dtype=h)), 1e-5)),
        (ops.window_attention, (leaf(randn(8, 49, 3, 2, 32, dtype=h)), leaf(randn(169, 2, dtype=h)),
                                relative_position_index(7), torch.zeros(4, 49, 49, device=DEVICE), 32 ** -0.5)),
        (ops.linear, (leaf(randn(6, 96, dtype=h)), leaf(randn(64, 96, dtype=h)), leaf(randn(64, dtype=h)),
                      "bias_gelu")),
        (ops.bert_layer, (leaf(randn(2, 40, 128, dtype=h)), lengths, [leaf(p) for p in bert_layer_params(128, 256)],
                          2, 0.125, 0.1, 0.1, 0.1, philox, 1e-12, "none")),
        (ops.swin_block, (leaf(randn(2, 14, 14, 64)), [leaf(p) for p in swin_block_params(64, 2, 7, 256)],
                          relative_position_index(7), torch.zeros(4, 49, 49, device=DEVICE),
                          torch.tensor([1.25, 0.0], device=DEVICE), None, h, 7, 3, 2, 32 ** -0.5, 1e-5, 1e-5, "none")),
    ]


@pytest.mark.parametrize("index", range(14))
def test_opcheck(index):
    op, args = opcheck_samples()[index]
    torch.library.opcheck(op, args)


def test_bad_input_raises_one_clear_error():
    ops = torch.ops.fusekit
    x = randn(4, 8)
    w = randn(8)
    with pytest.raises(ValueError, match="fusekit::layernorm: x must be a CUDA tensor"):
        ops.layernorm(x.cpu(), w, w, 1e-5)
    with pytest.raises(TypeError, match="gamma is Half but x is Float"):
        ops.layernorm(x, w.half(), w, 1e-5)
    with pytest.raises(ValueError, match="must be contiguous"):
        ops.layernorm(x.t(), w, w, 1e-5)
    with pytest.raises(ValueError, match="gamma has 7 elements, expected 8"):
        ops.layernorm(x, w[:7].contiguous(), w, 1e-5)
    with pytest.raises(ValueError, match="head_dim"):
        fk.bert_attention(randn(1, 4, 3, 2, 48, dtype=torch.float16), torch.ones(1, dtype=torch.int32,
                                                                                 device=DEVICE), 0.1)
    with pytest.raises(ValueError, match="dropout p must be in"):
        fk.bias_dropout_residual_layer_norm(x, w, x, w, w, 1.0)
    with pytest.raises(TypeError, match="labels must be Long"):
        fk.cross_entropy(x, torch.zeros(4, dtype=torch.int32, device=DEVICE))
    layer_x, layer_lengths = randn(1, 8, 64, dtype=torch.float16), torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="params must hold the layer's 16 tensors, not 15"):
        fk.bert_layer(layer_x, layer_lengths, bert_layer_params(64, 128)[:15], 1, 0.125)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        fk.bert_layer(layer_x.float(), layer_lengths, bert_layer_params(64, 128), 1, 0.125)
    with pytest.raises(ValueError, match=r"params\[10\] has shape \[128, 32\], expected \[128, 64\]"):
        wrong = bert_layer_params(64, 128)
        wrong[10] = randn(128, 32)
        fk.bert_layer(layer_x, layer_lengths, wrong, 1, 0.125)
    block_x, index = randn(1, 7, 7, 64), relative_position_index(7)
    with pytest.raises(ValueError, match="params must hold the block's 13 tensors, not 12"):
        fk.swin_block(block_x, swin_block_params(64, 2, 7, 256)[:12], index, None, torch.float16, 7, 0, 2, 0.17)
    with pytest.raises(TypeError, match="dtype .the compute dtype. must be float16 or bfloat16"):
        fk.swin_block(block_x, swin_block_params(64, 2, 7, 256), index, None, torch.float32, 7, 0, 2, 0.17)


def test_adamw_matches_torch():
    """fusekit.torch.AdamW against torch.optim.AdamW (foreach=False) over 5 steps, odd sizes, two
    groups (one without weight decay), a parameter that misses a step (its own step count)."""
    import fusekit.torch

    torch.manual_seed(3)
    shapes = [(7,), (33, 65), (1000, 3), (1,)]
    mine = [torch.randn(s, device=DEVICE, requires_grad=True) for s in shapes]
    theirs = [p.detach().clone().requires_grad_(True) for p in mine]

    def groups(ps):
        return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]

    ours = fusekit.torch.AdamW(groups(mine), lr=1e-2, betas=(0.9, 0.99), eps=1e-6)
    reference = torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.9, 0.99), eps=1e-6, foreach=False)
    for step in range(5):
        for a, b in zip(mine, theirs):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        if step == 2:
            mine[3].grad = theirs[3].grad = None
        ours.step()
        reference.step()
    for a, b in zip(mine, theirs):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max().item()


def test_adamw_refuses_half_parameters():
    import fusekit.torch

    p = torch.randn(8, device=DEVICE, dtype=torch.float16, requires_grad=True)
    p.grad = torch.randn_like(p)
    with pytest.raises(TypeError, match="float32 CUDA tensors"):
        fusekit.torch.AdamW([p]).step()
