"""Swin window-merge peers: window_reverse, torch.roll by (shift, shift), the residual add (a Swin
block after its window attention); forward and forward + backward through autograd."""
import torch

from .common import DTYPES, PeerCase, rotation_sets, uniform
from .swin_window import parse_window_shape, size_of, window_reverse


def window_merge(windows, shortcut, dy, window: int, shift: int):
    if dy is not None:
        windows, shortcut = (t.detach().requires_grad_(True) for t in (windows, shortcut))
    b, h, w, _ = shortcut.shape
    x = window_reverse(windows, window, b, h, w)
    if shift > 0:
        x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
    y = shortcut + x
    if dy is not None:
        y.backward(dy)
    return y


def make_case(case):
    b, h, w, c, window, shift = parse_window_shape(case.shape)
    dtype = DTYPES[case.dtype]
    size = size_of(dtype)
    backward = case.backward
    sets = rotation_sets(b * h * w * c * size * (5 if backward else 3))
    inputs = {}

    def make_step(fn):
        if not inputs:
            windows = (b * h * w // (window * window), window * window, c)
            inputs["windows"] = [uniform(windows, dtype) for _ in range(sets)]
            inputs["shortcut"] = [uniform((b, h, w, c), dtype) for _ in range(sets)]
            inputs["dy"] = [uniform((b, h, w, c), dtype) for _ in range(sets)] if backward else None
        i = inputs
        return lambda s: fn(i["windows"][s], i["shortcut"][s], i["dy"][s] if backward else None, window, shift)

    return PeerCase(case.name, sets, make_step, window_merge, backward, release=inputs.clear)
