"""Swin window-merge peers: window_reverse, torch.roll by (shift, shift), the residual add (a Swin
block after its window attention); forward and forward + backward through autograd."""
import torch

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform
from .swin_window import WINDOW_SHAPES, parse_window_shape, size_of, window_reverse

NAME = "window_merge"
SHAPES = WINDOW_SHAPES  # suites/ops/swin_window.cpp


def bytes_moved(b: int, h: int, w: int, c: int, size: int, backward: bool) -> float:
    # Forward reads windows and shortcut and writes y; backward reads dy and writes dwindows (the
    # shortcut's gradient is dy itself: nothing is written for it).
    n = b * h * w * c
    return 3 * n * size + (2 * n * size if backward else 0)


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


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                b, h, w, c, window, shift = parse_window_shape(shape)
                dtype = DTYPES[dtype_name]
                size = size_of(dtype)
                sets = rotation_sets(b * h * w * c * size * (5 if backward else 3))
                inputs = {}

                def make_step(fn, b=b, h=h, w=w, c=c, window=window, shift=shift, dtype=dtype, sets=sets,
                              backward=backward, inputs=inputs):
                    if not inputs:
                        windows = (b * h * w // (window * window), window * window, c)
                        inputs["windows"] = [uniform(windows, dtype) for _ in range(sets)]
                        inputs["shortcut"] = [uniform((b, h, w, c), dtype) for _ in range(sets)]
                        inputs["dy"] = [uniform((b, h, w, c), dtype) for _ in range(sets)] if backward else None
                    i = inputs
                    return lambda s: fn(i["windows"][s], i["shortcut"][s], i["dy"][s] if backward else None,
                                        window, shift)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(b, h, w, c, size, backward), sets, make_step, window_merge, backward,
                               release=inputs.clear)
