"""Bias + dropout + residual + LayerNorm peers (post-LN, p = 0.1): F.dropout(x + bias) + residual, then
F.layer_norm; forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform

EPS = 1e-5
P = 0.1


def bias_dropout_residual_layernorm(x, bias, residual, gamma, beta, dy):
    if dy is None:
        h = F.dropout(x + bias, P, training=True) + residual
        return F.layer_norm(h, (x.shape[-1],), gamma, beta, EPS)
    x, bias, residual, gamma, beta = (t.detach().requires_grad_(True) for t in (x, bias, residual, gamma, beta))
    h = F.dropout(x + bias, P, training=True) + residual
    y = F.layer_norm(h, (x.shape[-1],), gamma, beta, EPS)
    y.backward(dy)
    return y


def make_case(case):
    rows, columns = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    sets = rotation_sets(rows * columns * size * (6 if backward else 3))
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["x"] = [uniform((rows, columns), dtype) for _ in range(sets)]
            inputs["residual"] = [uniform((rows, columns), dtype, 2.0, 0.5) for _ in range(sets)]
            inputs["dy"] = [uniform((rows, columns), dtype) for _ in range(sets)] if backward else None
            inputs["bias"] = uniform(columns, dtype, 0.5)
            inputs["gamma"] = uniform(columns, dtype, 0.2, 1.0)
            inputs["beta"] = uniform(columns, dtype, 0.1)
        i = inputs
        return lambda s: fn(i["x"][s], i["bias"], i["residual"][s], i["gamma"], i["beta"],
                            i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, bias_dropout_residual_layernorm, backward, release=inputs.clear)
