"""LayerNorm peers: F.layer_norm, forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "layernorm"
# The suite's shapes (suites/ops/layernorm.cpp).
SHAPES = ["8192x768", "8192x1024", "16384x1024", "401408x96", "401408x128", "401408x192", "100352x384", "6272x768"]
EPS = 1e-5


def bytes_moved(rows: int, columns: int, size: int, backward: bool) -> float:
    # suites/ops/layernorm.cpp's model: a forward-only case is inference (no mean and rstd saved).
    forward = 2 * rows * columns * size + 2 * columns * size
    statistics = 2 * rows * 4
    back = 3 * rows * columns * size + 3 * columns * size
    return forward + back + 2 * statistics if backward else forward


def layernorm(x, gamma, beta, dy):
    if dy is None:
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
    x = x.detach().requires_grad_(True)
    gamma = gamma.detach().requires_grad_(True)
    beta = beta.detach().requires_grad_(True)
    y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
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
                        inputs["x"] = [uniform((rows, columns), dtype, 2.0, 0.5) for _ in range(sets)]
                        inputs["dy"] = [uniform((rows, columns), dtype) for _ in range(sets)] if backward else None
                        inputs["gamma"] = uniform(columns, dtype, 0.2, 1.0)
                        inputs["beta"] = uniform(columns, dtype, 0.1)
                    i = inputs
                    return lambda s: fn(i["x"][s], i["gamma"], i["beta"], i["dy"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(rows, columns, size, backward), sets, make_step, layernorm, backward,
                               release=inputs.clear)
