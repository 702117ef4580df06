"""LayerNorm peers: F.layer_norm, forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform

EPS = 1e-5


def layernorm(x, gamma, beta, dy):
    if dy is None:
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
    x = x.detach().requires_grad_(True)
    gamma = gamma.detach().requires_grad_(True)
    beta = beta.detach().requires_grad_(True)
    y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
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
            inputs["x"] = [uniform((rows, columns), dtype, 2.0, 0.5) for _ in range(sets)]
            inputs["dy"] = [uniform((rows, columns), dtype) for _ in range(sets)] if backward else None
            inputs["gamma"] = uniform(columns, dtype, 0.2, 1.0)
            inputs["beta"] = uniform(columns, dtype, 0.1)
        i = inputs
        return lambda s: fn(i["x"][s], i["gamma"], i["beta"], i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, layernorm, backward, release=inputs.clear)
