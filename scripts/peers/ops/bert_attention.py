"""BERT attention peers: HuggingFace's BertSelfAttention core without SDPA ("eager" attention) from the
packed qkv (split and permute to [batch, heads, seq, head_dim], q @ k^T * scale, + the additive
key-padding mask with the dtype's lowest value, softmax, dropout, @ v, permute, reshape), forward and
forward + backward through autograd, as baselines/bert_attention.cpp composes it. Shapes, valid
lengths and byte counts as suites/ops/bert_attention.cpp."""
import torch

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "bert_attention"
# The suite's shapes (suites/ops/bert_attention.cpp).
SHAPES = ["64x12x128x64:p0.1", "32x12x512x64:p0.1", "64x16x128x64:p0.1", "32x16x512x64:p0.1"]


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


def bytes_moved(batch, heads, seq, head_dim, size, backward) -> float:
    """The same count as bytes_moved in suites/ops/bert_attention.cpp."""
    rows = batch * seq
    qkv = rows * 3 * heads * head_dim * size
    out = rows * heads * head_dim * size
    lse = rows * heads * 4
    lengths = batch * 4
    forward = qkv + lengths + out + lse
    backward_bytes = qkv + lengths + out + out + lse + qkv
    return float(forward + backward_bytes if backward else forward)


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


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                batch, heads, seq, head_dim, p = parse(shape)
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                rows = batch * seq
                per_set = (rows * 3 * heads * head_dim + rows * heads * head_dim) * size * (2 if backward else 1) + \
                    rows * heads * 4
                sets = rotation_sets(per_set)
                inputs = {}

                def make_step(fn, dims=(batch, heads, seq, head_dim, p), dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
                    b, h, n, d, prob = dims
                    if not inputs:
                        inputs["qkv"] = [uniform((b, n, 3, h, d), dtype) for _ in range(sets)]
                        inputs["dout"] = [uniform((b, n, h * d), dtype) for _ in range(sets)] if backward else None
                        lengths = torch.tensor([valid_length(i, n) for i in range(b)], dtype=torch.int32,
                                               device="cuda")
                        inputs["mask"] = additive_mask(lengths, n, dtype)
                    i, scale = inputs, d ** -0.5
                    return lambda s: fn(i["qkv"][s], i["mask"], scale, prob, i["dout"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(batch, heads, seq, head_dim, size, backward), sets, make_step,
                               with_autograd, backward, release=inputs.clear)
