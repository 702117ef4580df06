"""What the Swin window-operation peers share (not an operator): their shapes' parsing, as
suites/ops/swin_window.cpp parses them, and Swin's own window_partition/window_reverse."""
import re

import torch

EPS = 1e-5  # nn.LayerNorm's default, as Swin uses it


def parse_window_shape(shape: str):
    """"64x56x56x96:ws7:shift3" -> (64, 56, 56, 96, 7, 3)."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+):ws(\d+):shift(\d+)", shape)
    if not match:
        raise ValueError(f"unsupported shape '{shape}': expected BxHxWxC:wsN:shiftS")
    return tuple(int(v) for v in match.groups())


def window_partition(x, window: int):
    """[B, H, W, C] -> [B * nW, ws * ws, C], as Swin's window_partition (then the view to tokens)."""
    b, h, w, c = x.shape
    x = x.view(b, h // window, window, w // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window * window, c)


def window_reverse(windows, window: int, b: int, h: int, w: int):
    """[B * nW, ws * ws, C] -> [B, H, W, C], as Swin's window_reverse."""
    c = windows.shape[-1]
    x = windows.view(b, h // window, w // window, window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, c)


def size_of(dtype) -> int:
    return torch.finfo(dtype).bits // 8
