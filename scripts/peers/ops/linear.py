"""Linear layer peers: F.linear, then F.gelu(approximate="tanh") for bias_gelu, forward and forward +
backward through autograd. The bias_gelu backward starts, as fusekit's does, at the next layer's
output gradient dz [M, K] and weight [K, N]: dy = dz @ W_next, then autograd."""
import math

import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform


def parse(shape: str):
    sizes, *options = shape.split(":")
    m, n, k = (int(v) for v in sizes.split("x"))
    gelu = "bias_gelu" in options
    padded = "padded" in options
    return m, n, k, gelu, padded


def padded_size(features: int) -> int:
    return (features + 7) // 8 * 8


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


def make_case(case):
    m, n, k, gelu, padded = parse(case.shape)
    ns, ks = (padded_size(n), padded_size(k)) if padded else (n, k)
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    per_set = m * ks + m * ns + (m * ns if gelu else 0)
    if backward:
        per_set += (m * ks + m * ns + m * ks) if gelu else (m * ns + m * ks)
    sets = rotation_sets(per_set * size)
    inputs = {}

    def make_step(fn):
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

    return PeerCase(case.name, sets, make_step, linear_bias_gelu if gelu else linear_bias, backward,
                    release=inputs.clear)
