"""bias + GELU peers: F.gelu(x + bias) (erf form), forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform


def bias_gelu(x, bias, dy):
    if dy is None:
        return F.gelu(x + bias)
    x = x.detach().requires_grad_(True)
    bias = bias.detach().requires_grad_(True)
    y = F.gelu(x + bias)
    y.backward(dy)
    return y


def make_case(case):
    rows, columns = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    sets = rotation_sets(rows * columns * size * (4 if backward else 2))
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["x"] = [uniform((rows, columns), dtype, 3.0) for _ in range(sets)]
            inputs["dy"] = [uniform((rows, columns), dtype) for _ in range(sets)] if backward else None
            inputs["bias"] = uniform(columns, dtype, 0.5)
        i = inputs
        return lambda s: fn(i["x"][s], i["bias"], i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, bias_gelu, backward, release=inputs.clear)
