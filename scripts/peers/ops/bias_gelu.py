"""bias + GELU peers: F.gelu(x + bias) (erf form), forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "bias_gelu"
# The suite's shapes (suites/ops/bias_gelu.cpp).
SHAPES = ["8192x3072", "8192x4096", "16384x4096", "401408x384", "401408x512", "100352x1536", "6272x3072"]


def bytes_moved(rows: int, columns: int, size: int, backward: bool) -> float:
    forward = 2 * rows * columns * size + columns * size
    back = 3 * rows * columns * size + 2 * columns * size
    return forward + back if backward else forward


def bias_gelu(x, bias, dy):
    if dy is None:
        return F.gelu(x + bias)
    x = x.detach().requires_grad_(True)
    bias = bias.detach().requires_grad_(True)
    y = F.gelu(x + bias)
    y.backward(dy)
    return y


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                rows, columns = (int(v) for v in shape.split("x"))
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                sets = rotation_sets(rows * columns * size * (4 if backward else 2))
                inputs = {}

                def make_step(fn, rows=rows, columns=columns, dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
                    if not inputs:
                        inputs["x"] = [uniform((rows, columns), dtype, 3.0) for _ in range(sets)]
                        inputs["dy"] = [uniform((rows, columns), dtype) for _ in range(sets)] if backward else None
                        inputs["bias"] = uniform(columns, dtype, 0.5)
                    i = inputs
                    return lambda s: fn(i["x"][s], i["bias"], i["dy"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(rows, columns, size, backward), sets, make_step, bias_gelu, backward,
                               release=inputs.clear)
