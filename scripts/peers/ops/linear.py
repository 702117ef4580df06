"""Linear layer peers: F.linear, then F.gelu(approximate="tanh") for bias_gelu, forward and forward +
backward through autograd. The bias_gelu backward starts, as fusekit's does, at the next layer's
output gradient dz [M, K] and weight [K, N]: dy = dz @ W_next, then autograd."""
import math

import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "linear"
# The suite's shapes (suites/ops/linear.cpp): "MxNxK[:bias|:bias_gelu][:padded]".
SHAPES = ["8192x3072x768:bias_gelu", "8192x768x3072:bias", "8192x4096x1024:bias_gelu", "401408x49x32:bias",
          "401408x49x32:bias:padded", "401408x32x49:bias", "401408x32x49:bias:padded"]


def parse(shape: str):
    sizes, *options = shape.split(":")
    m, n, k = (int(v) for v in sizes.split("x"))
    gelu = "bias_gelu" in options
    padded = "padded" in options
    return m, n, k, gelu, padded


def padded_size(features: int) -> int:
    return (features + 7) // 8 * 8


def bytes_moved(m: int, n: int, k: int, gelu: bool, size: int, backward: bool) -> float:
    """Logical sizes, padded or not (as suites/ops/linear.cpp counts them)."""
    forward = size * (m * k + n * k + n + m * n + (m * n if gelu else 0))
    if gelu:
        back = size * (m * k + k * n + m * n + m * n + n + m * k + n * k + m * k + n * k)
    else:
        back = size * (m * n + m * k + n * k + m * k + n * k + n)
    return forward + back if backward else forward


def flops(m: int, n: int, k: int, gelu: bool, backward: bool) -> float:
    return 2.0 * m * n * k * (1 + ((3 if gelu else 2) if backward else 0))


def linear_bias(x, weight, bias, dy):
    if dy is None:
        return F.linear(x, weight, bias)
    x = x.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    bias = bias.detach().requires_grad_(True)
    y = F.linear(x, weight, bias)
    y.backward(dy)
    return y


def linear_bias_gelu(x, weight, bias, dz, weight_next):
    if dz is None:
        return F.gelu(F.linear(x, weight, bias), approximate="tanh")
    x = x.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    bias = bias.detach().requires_grad_(True)
    y = F.gelu(F.linear(x, weight, bias), approximate="tanh")
    with torch.no_grad():
        dy = dz @ weight_next
    y.backward(dy)
    return y


def padded_uniform(rows, columns, rows_stored, columns_stored, dtype, scale):
    """uniform [rows, columns] values in a zero [rows_stored, columns_stored] tensor."""
    out = torch.zeros((rows_stored, columns_stored), dtype=dtype, device="cuda")
    out[:rows, :columns] = uniform((rows, columns), dtype, scale)
    return out


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                m, n, k, gelu, padded = parse(shape)
                ns, ks = (padded_size(n), padded_size(k)) if padded else (n, k)
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                per_set = m * ks + m * ns + (m * ns if gelu else 0)
                if backward:
                    per_set += (m * ks + m * ns + m * ks) if gelu else (m * ns + m * ks)
                sets = rotation_sets(per_set * size)
                inputs = {}

                def make_step(fn, m=m, n=n, k=k, ns=ns, ks=ks, gelu=gelu, dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
                    if not inputs:
                        inputs["x"] = [padded_uniform(m, k, m, ks, dtype, 1.0) for _ in range(sets)]
                        inputs["weight"] = padded_uniform(n, k, ns, ks, dtype, 1.0 / math.sqrt(k))
                        inputs["bias"] = padded_uniform(1, n, 1, ns, dtype, 0.5).view(ns)
                        if backward and gelu:
                            inputs["dz"] = [padded_uniform(m, k, m, ks, dtype, 1.0) for _ in range(sets)]
                            inputs["weight_next"] = padded_uniform(k, n, ks, ns, dtype, 1.0 / math.sqrt(n))
                        elif backward:
                            inputs["dy"] = [padded_uniform(m, n, m, ns, dtype, 1.0) for _ in range(sets)]
                    i = inputs
                    if gelu:
                        return lambda s: fn(i["x"][s], i["weight"], i["bias"], i["dz"][s] if backward else None,
                                            i["weight_next"] if backward else None)
                    return lambda s: fn(i["x"][s], i["weight"], i["bias"], i["dy"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(m, n, k, gelu, size, backward), sets, make_step,
                               linear_bias_gelu if gelu else linear_bias, backward, release=inputs.clear,
                               flops=flops(m, n, k, gelu, backward))
