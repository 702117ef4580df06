"""QKV projection peers: the query, key and value projections as three F.linear calls (HuggingFace's
BertSelfAttention), forward and forward + backward through autograd from dqkv [tokens, 3 * hidden]
(each projection's gradient is its third)."""
import math

import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform


def qkv_projection(x, weights, biases, dqkv):
    if dqkv is None:
        return [F.linear(x, w, b) for w, b in zip(weights, biases)]
    x = x.detach().requires_grad_(True)
    leaves = [(w.detach().requires_grad_(True), b.detach().requires_grad_(True)) for w, b in zip(weights, biases)]
    outputs = [F.linear(x, w, b) for w, b in leaves]
    parts = dqkv.view(x.shape[0], 3, -1)
    torch.autograd.backward(outputs, [parts[:, i] for i in range(3)])
    return outputs


def make_case(case):
    tokens, hidden = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    per_set = tokens * hidden * size * (4 + (4 if backward else 0))
    sets = rotation_sets(per_set)
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["x"] = [uniform((tokens, hidden), dtype) for _ in range(sets)]
            inputs["dqkv"] = [uniform((tokens, 3 * hidden), dtype) for _ in range(sets)] if backward else None
            inputs["weights"] = [uniform((hidden, hidden), dtype, 1.0 / math.sqrt(hidden)) for _ in range(3)]
            inputs["biases"] = [uniform(hidden, dtype, 0.5) for _ in range(3)]
        i = inputs
        return lambda s: fn(i["x"][s], i["weights"], i["biases"], i["dqkv"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, qkv_projection, backward, release=inputs.clear)
