"""Scale + mask + softmax peers: x * scale, then masked_fill(-inf) or + bias (+ window mask), then
softmax over the keys in the storage dtype; forward and forward + backward through autograd, as
baselines/softmax.cpp composes it. Shapes and padding lengths as suites/ops/softmax.cpp."""
import torch

from .common import DTYPES, PeerCase, rotation_sets, uniform

SCALE = 0.125
SWIN_IMAGES = 128
MASK64 = (1 << 64) - 1


def parse(shape: str):
    """"BxHxSQxSK:MASK" -> (batch, heads, queries, keys, mask, windows), as parse_softmax_shape."""
    sizes, mask = shape.split(":")
    batch, heads, queries, keys = (int(v) for v in sizes.split("x"))
    windows = 0
    if mask.startswith("bias"):
        windows = int(mask[4:]) if mask[4:] else (batch // SWIN_IMAGES if batch // SWIN_IMAGES > 1 else 0)
        mask = "bias"
    return batch, heads, queries, keys, mask, windows


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def padding_lengths(batch: int, keys: int, set_index: int) -> list:
    """Valid key counts of one operand set, the same formula as padding_lengths in suites/ops/softmax.cpp."""
    return [1 + splitmix64((b + set_index) % batch) % keys for b in range(batch)]


def with_autograd(probabilities):
    """The case function: the forward alone, or forward and backward from dy."""
    def run(x, mask_inputs, dy):
        if dy is None:
            return probabilities(x, *mask_inputs)
        x = x.detach().requires_grad_(True)
        y = probabilities(x, *mask_inputs)
        y.backward(dy)
        return y
    return run


def unmasked(x):
    return torch.softmax(x * SCALE, dim=-1)


def padded(x, lengths):
    batch, keys = x.shape[0], x.shape[-1]
    key = torch.arange(keys, device=x.device, dtype=lengths.dtype).view(1, 1, 1, keys)
    return torch.softmax((x * SCALE).masked_fill(key >= lengths.view(batch, 1, 1, 1), float("-inf")), dim=-1)


def causal(x):
    queries, keys = x.shape[-2], x.shape[-1]
    above = torch.ones(queries, keys, dtype=torch.bool, device=x.device).triu(keys - queries + 1)
    return torch.softmax((x * SCALE).masked_fill(above, float("-inf")), dim=-1)


def biased(x, bias, window_mask):
    scores = x * SCALE + bias.unsqueeze(0)
    if window_mask is not None:
        batch, heads, queries, keys = x.shape
        windows = window_mask.shape[0]
        scores = scores.view(batch // windows, windows, heads, queries, keys) + window_mask.unsqueeze(1).unsqueeze(0)
        scores = scores.view(batch, heads, queries, keys)
    return torch.softmax(scores, dim=-1)


# One function per mask kind, so torch.compile keeps a cache per kind.
FUNCTIONS = {"none": with_autograd(unmasked), "padding": with_autograd(padded), "causal": with_autograd(causal),
             "bias": with_autograd(biased)}


def make_case(case):
    batch, heads, queries, keys, mask, windows = parse(case.shape)
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    n = batch * heads * queries * keys
    sets = rotation_sets(n * size * (4 if backward else 2))
    inputs = {}

    def make_step(fn):
        b, h, q, k = dims = (batch, heads, queries, keys)
        if not inputs:
            inputs["x"] = [uniform(dims, dtype, 8.0) for _ in range(sets)]
            inputs["dy"] = [uniform(dims, dtype) for _ in range(sets)] if backward else None
            if mask == "padding":
                inputs["mask"] = [(torch.tensor(padding_lengths(b, k, s), dtype=torch.int32,
                                                device="cuda"),) for s in range(sets)]
            elif mask == "bias":
                bias = uniform((h, q, k), dtype, 2.0)
                window_mask = uniform((windows, q, k), dtype) if windows > 0 else None
                inputs["mask"] = [(bias, window_mask)] * sets
            else:
                inputs["mask"] = [()] * sets
        i = inputs
        return lambda s: fn(i["x"][s], i["mask"][s], i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, FUNCTIONS[mask], backward, release=inputs.clear)
