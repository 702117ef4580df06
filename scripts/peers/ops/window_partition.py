"""Swin window-partition peers: F.layer_norm, torch.roll by (-shift, -shift), window_partition (a
Swin block's norm1, cyclic shift and partition); forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform
from .swin_window import EPS, parse_window_shape, size_of
from .swin_window import window_partition as partition


def window_partition(x, gamma, beta, dwindows, window: int, shift: int):
    if dwindows is not None:
        x, gamma, beta = (t.detach().requires_grad_(True) for t in (x, gamma, beta))
    y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
    if shift > 0:
        y = torch.roll(y, shifts=(-shift, -shift), dims=(1, 2))
    windows = partition(y, window)
    if dwindows is not None:
        windows.backward(dwindows)
    return windows


def make_case(case):
    b, h, w, c, window, shift = parse_window_shape(case.shape)
    dtype = DTYPES[case.dtype]
    size = size_of(dtype)
    backward = case.backward
    sets = rotation_sets(b * h * w * c * size * (4 if backward else 2))
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["x"] = [uniform((b, h, w, c), dtype, 2.0, 0.5) for _ in range(sets)]
            windows = (b * h * w // (window * window), window * window, c)
            inputs["dwindows"] = [uniform(windows, dtype) for _ in range(sets)] if backward else None
            inputs["gamma"] = uniform(c, dtype, 0.2, 1.0)
            inputs["beta"] = uniform(c, dtype, 0.1)
        i = inputs
        return lambda s: fn(i["x"][s], i["gamma"], i["beta"], i["dwindows"][s] if backward else None, window, shift)

    return PeerCase(case.name, sets, make_step, window_partition, backward, release=inputs.clear)
