"""Swin patch-merging peers: the four strided slices x0 = x[:, 0::2, 0::2], x1 = x[:, 1::2, 0::2],
x2 = x[:, 0::2, 1::2], x3 = x[:, 1::2, 1::2], torch.cat on channels, F.layer_norm over 4C (Swin's
PatchMerging before its reduction Linear); forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform
from .swin_window import EPS, size_of


def patch_merging(x, gamma, beta, dy):
    if dy is not None:
        x, gamma, beta = (t.detach().requires_grad_(True) for t in (x, gamma, beta))
    x0 = x[:, 0::2, 0::2, :]
    x1 = x[:, 1::2, 0::2, :]
    x2 = x[:, 0::2, 1::2, :]
    x3 = x[:, 1::2, 1::2, :]
    merged = torch.cat([x0, x1, x2, x3], -1)
    y = F.layer_norm(merged, (merged.shape[-1],), gamma, beta, EPS)
    if dy is not None:
        y.backward(dy)
    return y


def make_case(case):
    b, h, w, c = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    size = size_of(dtype)
    backward = case.backward
    sets = rotation_sets(b * h * w * c * size * (4 if backward else 2))
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["x"] = [uniform((b, h, w, c), dtype, 2.0, 0.5) for _ in range(sets)]
            dy = (b, h // 2, w // 2, 4 * c)
            inputs["dy"] = [uniform(dy, dtype) for _ in range(sets)] if backward else None
            inputs["gamma"] = uniform(4 * c, dtype, 0.2, 1.0)
            inputs["beta"] = uniform(4 * c, dtype, 0.1)
        i = inputs
        return lambda s: fn(i["x"][s], i["gamma"], i["beta"], i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, patch_merging, backward, release=inputs.clear)
