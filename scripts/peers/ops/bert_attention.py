"""BERT attention peers: HuggingFace's BertSelfAttention core without SDPA ("eager" attention) from the
packed qkv (split and permute to [batch, heads, seq, head_dim], q @ k^T * scale, + the additive
key-padding mask with the dtype's lowest value, softmax, dropout, @ v, permute, reshape), forward and
forward + backward through autograd, as baselines/bert_attention.cpp composes it. Shapes, valid
lengths as suites/ops/bert_attention.cpp."""
import torch

from .common import DTYPES, PeerCase, rotation_sets, uniform


def parse(shape: str):
    """"BATCHxHEADSxSEQxD[:pPROB]" -> (batch, heads, seq, head_dim, p)."""
    sizes, _, option = shape.partition(":")
    batch, heads, seq, head_dim = (int(v) for v in sizes.split("x"))
    p = float(option[1:]) if option.startswith("p") else 0.0
    return batch, heads, seq, head_dim, p


def valid_length(b: int, seq: int) -> int:
    """Sequence b's valid length in [ceil(seq / 2), seq]: the 32-bit hash of valid_length in the C++ suite."""
    mask = 0xFFFFFFFF
    x = (b * 2654435761 + 12345) & mask
    x ^= x >> 16
    x = (x * 0x45D9F3B) & mask
    x ^= x >> 16
    low = (seq + 1) // 2
    return low + x % (seq - low + 1)


def additive_mask(valid_lengths, seq, dtype):
    """[batch, 1, 1, seq]: 0 for valid keys, the dtype's lowest value for padded ones (HuggingFace)."""
    valid = torch.arange(seq, device=valid_lengths.device)[None, :] < valid_lengths[:, None]
    return torch.where(valid, 0.0, torch.finfo(dtype).min).to(dtype)[:, None, None, :]


def attention(qkv, mask, scale, p):
    batch, seq, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-2, -1)) * scale + mask
    probabilities = torch.nn.functional.dropout(torch.softmax(scores, dim=-1), p=p, training=True)
    return (probabilities @ v).permute(0, 2, 1, 3).reshape(batch, seq, heads * head_dim)


def with_autograd(qkv, mask, scale, p, dout):
    """The case function: the forward alone, or forward and backward from dout."""
    if dout is None:
        return attention(qkv, mask, scale, p)
    qkv = qkv.detach().requires_grad_(True)
    out = attention(qkv, mask, scale, p)
    out.backward(dout)
    return out


def make_case(case):
    batch, heads, seq, head_dim, p = parse(case.shape)
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    rows = batch * seq
    per_set = (rows * 3 * heads * head_dim + rows * heads * head_dim) * size * (2 if backward else 1) + \
        rows * heads * 4
    sets = rotation_sets(per_set)
    inputs = {}

    def make_step(fn):
        b, h, n, d, prob = batch, heads, seq, head_dim, p
        if not inputs:
            inputs["qkv"] = [uniform((b, n, 3, h, d), dtype) for _ in range(sets)]
            inputs["dout"] = [uniform((b, n, h * d), dtype) for _ in range(sets)] if backward else None
            lengths = torch.tensor([valid_length(i, n) for i in range(b)], dtype=torch.int32, device="cuda")
            inputs["mask"] = additive_mask(lengths, n, dtype)
        i, scale = inputs, d ** -0.5
        return lambda s: fn(i["qkv"][s], i["mask"], scale, prob, i["dout"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, with_autograd, backward, release=inputs.clear)
