"""Bias + dropout + residual + LayerNorm peers (post-LN, p = 0.1): F.dropout(x + bias) + residual, then
F.layer_norm; forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "bias_dropout_residual_layernorm"
# The suite's shapes (suites/ops/bias_dropout_residual_layernorm.cpp).
SHAPES = ["8192x768", "8192x1024", "16384x1024", "401408x96", "401408x128", "100352x384", "6272x768"]
EPS = 1e-5
P = 0.1


def bytes_moved(rows: int, columns: int, size: int, backward: bool) -> float:
    # As fusekit counts them: the forward reads x, residual, bias, gamma, beta and writes y, mean,
    # rstd; the backward reads dy, x, residual, bias, gamma, mean, rstd and writes dx, dresidual,
    # dbias, dgamma, dbeta. The dropout mask is not counted (fusekit regenerates it).
    forward = 3 * rows * columns * size + 3 * columns * size + 2 * rows * 4
    back = 5 * rows * columns * size + 5 * columns * size + 2 * rows * 4
    return forward + back if backward else forward


def bias_dropout_residual_layernorm(x, bias, residual, gamma, beta, dy):
    if dy is None:
        h = F.dropout(x + bias, P, training=True) + residual
        return F.layer_norm(h, (x.shape[-1],), gamma, beta, EPS)
    x, bias, residual, gamma, beta = (t.detach().requires_grad_(True) for t in (x, bias, residual, gamma, beta))
    h = F.dropout(x + bias, P, training=True) + residual
    y = F.layer_norm(h, (x.shape[-1],), gamma, beta, EPS)
    y.backward(dy)
    return y


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                rows, columns = (int(v) for v in shape.split("x"))
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                sets = rotation_sets(rows * columns * size * (6 if backward else 3))
                inputs = {}

                def make_step(fn, rows=rows, columns=columns, dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
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

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(rows, columns, size, backward), sets, make_step,
                               bias_dropout_residual_layernorm, backward, release=inputs.clear)
