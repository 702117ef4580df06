"""Swin window attention peers: Swin's WindowAttention.forward from the packed qkv (permute, q * scale,
q @ k^T, + the relative position bias gathered from the table every step, + the shift mask, softmax,
@ v, transpose, reshape), forward and forward + backward through autograd (dqkv and the table's
gradient), as baselines/window_attention.cpp composes it. Shapes parsed as
suites/ops/window_attention.cpp."""
import torch

from .common import DTYPES, PeerCase, rotation_sets, uniform

SHIFT_MASK_WINDOWS = 64


def parse(shape: str):
    """"WINDOWSxHEADSxNxD[:shift]" -> (windows, heads, tokens, head_dim, mask_windows)."""
    sizes, _, mask = shape.partition(":")
    windows, heads, tokens, head_dim = (int(v) for v in sizes.split("x"))
    return windows, heads, tokens, head_dim, SHIFT_MASK_WINDOWS if mask == "shift" else 0


def window_of(tokens: int) -> int:
    return 7 if tokens == 49 else 12


def relative_position_index(window: int) -> torch.Tensor:
    """Swin's relative_position_index (int64 [N, N]), as kernels/window_attention.h computes it."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += window - 1
    relative[:, :, 1] += window - 1
    relative[:, :, 0] *= 2 * window - 1
    return relative.sum(-1).to("cuda")


def attention(qkv, table, index, mask, scale):
    windows, tokens, _, heads, head_dim = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    q = q * scale
    scores = q @ k.transpose(-2, -1)
    bias = table[index.view(-1)].view(tokens, tokens, heads).permute(2, 0, 1).contiguous()
    scores = scores + bias.unsqueeze(0)
    if mask is not None:
        mask_windows = mask.shape[0]
        scores = scores.view(windows // mask_windows, mask_windows, heads, tokens, tokens) + \
            mask.to(scores.dtype).unsqueeze(1).unsqueeze(0)
        scores = scores.view(windows, heads, tokens, tokens)
    probabilities = torch.softmax(scores, dim=-1)
    return (probabilities @ v).transpose(1, 2).reshape(windows, tokens, heads * head_dim)


def with_autograd(qkv, table, index, mask, scale, dout):
    """The case function: the forward alone, or forward and backward from dout."""
    if dout is None:
        return attention(qkv, table, index, mask, scale)
    qkv = qkv.detach().requires_grad_(True)
    table = table.detach().requires_grad_(True)
    out = attention(qkv, table, index, mask, scale)
    out.backward(dout)
    return out


def make_case(case):
    windows, heads, tokens, head_dim, mask_windows = parse(case.shape)
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    rows = windows * tokens
    per_set = (rows * 3 * heads * head_dim + rows * heads * head_dim) * size * (2 if backward else 1) + \
        rows * heads * 4
    sets = rotation_sets(per_set)
    inputs = {}

    def make_step(fn):
        w, h, n, d, nw = windows, heads, tokens, head_dim, mask_windows
        if not inputs:
            inputs["qkv"] = [uniform((w, n, 3, h, d), dtype) for _ in range(sets)]
            inputs["dout"] = [uniform((w, n, h * d), dtype) for _ in range(sets)] if backward else None
            inputs["table"] = uniform(((2 * window_of(n) - 1) ** 2, h), dtype)
            inputs["index"] = relative_position_index(window_of(n))
            inputs["mask"] = uniform((nw, n, n), torch.float32) if nw > 0 else None
        i, scale = inputs, d ** -0.5
        return lambda s: fn(i["qkv"][s], i["table"], i["index"], i["mask"], scale,
                            i["dout"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, with_autograd, backward, release=inputs.clear)
