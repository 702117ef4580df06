"""Swin window-partition peers: F.layer_norm, torch.roll by (-shift, -shift), window_partition (a
Swin block's norm1, cyclic shift and partition); forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform
from .swin_window import EPS, WINDOW_SHAPES, parse_window_shape, size_of
from .swin_window import window_partition as partition

NAME = "window_partition"
SHAPES = WINDOW_SHAPES  # suites/ops/swin_window.cpp


def bytes_moved(b: int, h: int, w: int, c: int, size: int, backward: bool) -> float:
    tokens = b * h * w
    n = tokens * c
    forward = 2 * n * size + 2 * c * size + 2 * tokens * 4
    back = 3 * n * size + 3 * c * size + 2 * tokens * 4
    return forward + back if backward else forward


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


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                b, h, w, c, window, shift = parse_window_shape(shape)
                dtype = DTYPES[dtype_name]
                size = size_of(dtype)
                sets = rotation_sets(b * h * w * c * size * (4 if backward else 2))
                inputs = {}

                def make_step(fn, b=b, h=h, w=w, c=c, window=window, shift=shift, dtype=dtype, sets=sets,
                              backward=backward, inputs=inputs):
                    if not inputs:
                        inputs["x"] = [uniform((b, h, w, c), dtype, 2.0, 0.5) for _ in range(sets)]
                        windows = (b * h * w // (window * window), window * window, c)
                        inputs["dwindows"] = [uniform(windows, dtype) for _ in range(sets)] if backward else None
                        inputs["gamma"] = uniform(c, dtype, 0.2, 1.0)
                        inputs["beta"] = uniform(c, dtype, 0.1)
                    i = inputs
                    return lambda s: fn(i["x"][s], i["gamma"], i["beta"], i["dwindows"][s] if backward else None,
                                        window, shift)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(b, h, w, c, size, backward), sets, make_step, window_partition, backward,
                               release=inputs.clear)
