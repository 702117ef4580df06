"""QKV projection peers: the query, key and value projections as three F.linear calls (HuggingFace's
BertSelfAttention), forward and forward + backward through autograd from dqkv [tokens, 3 * hidden]
(each projection's gradient is its third)."""
import math

import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "qkv_projection"
# The suite's shapes (suites/ops/qkv_projection.cpp): tokens x hidden.
SHAPES = ["8192x768", "16384x768", "8192x1024", "16384x1024"]


def bytes_moved(tokens: int, hidden: int, size: int, backward: bool) -> float:
    """As suites/ops/qkv_projection.cpp counts them."""
    t, h = tokens, hidden
    forward = (t * h + 3 * h * h + 3 * h + 3 * t * h) * size
    back = (3 * t * h + t * h + 3 * h * h + t * h + 3 * h * h + 3 * h) * size
    return forward + back if backward else forward


def flops(tokens: int, hidden: int, backward: bool) -> float:
    return 2.0 * tokens * 3 * hidden * hidden * (3 if backward else 1)


def qkv_projection(x, weights, biases, dqkv):
    if dqkv is None:
        return [F.linear(x, w, b) for w, b in zip(weights, biases)]
    x = x.detach().requires_grad_(True)
    leaves = [(w.detach().requires_grad_(True), b.detach().requires_grad_(True)) for w, b in zip(weights, biases)]
    outputs = [F.linear(x, w, b) for w, b in leaves]
    parts = dqkv.view(x.shape[0], 3, -1)
    torch.autograd.backward(outputs, [parts[:, i] for i in range(3)])
    return outputs


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                tokens, hidden = (int(v) for v in shape.split("x"))
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                per_set = tokens * hidden * size * (4 + (4 if backward else 0))
                sets = rotation_sets(per_set)
                inputs = {}

                def make_step(fn, tokens=tokens, hidden=hidden, dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
                    if not inputs:
                        inputs["x"] = [uniform((tokens, hidden), dtype) for _ in range(sets)]
                        inputs["dqkv"] = [uniform((tokens, 3 * hidden), dtype) for _ in range(sets)] if backward \
                            else None
                        inputs["weights"] = [uniform((hidden, hidden), dtype, 1.0 / math.sqrt(hidden))
                                             for _ in range(3)]
                        inputs["biases"] = [uniform(hidden, dtype, 0.5) for _ in range(3)]
                    i = inputs
                    return lambda s: fn(i["x"][s], i["weights"], i["biases"], i["dqkv"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(tokens, hidden, size, backward), sets, make_step, qkv_projection,
                               backward, release=inputs.clear, flops=flops(tokens, hidden, backward))
