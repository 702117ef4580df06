"""What every operator's peer module shares: the case record, rotation and the input makers."""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class PeerCase:
    """One case, named exactly as fusekit names it (suites/ops/<op>.cpp), so variants line up."""
    name: str                   # "<op>/<shape>/<dtype>/<fwd|fwd+bwd>"
    op: str
    shape: str
    dtype: str
    bytes: float                # bytes that must move, as fusekit counts them
    sets: int                   # rotated input sets
    make_step: Callable         # make_step(fn) -> step(set_index); fn is the eager or compiled function
    function: Callable          # the eager function; torch.compile wraps it
    backward: bool
    release: Optional[Callable] = None  # frees the inputs
    flops: float = 0.0          # floating-point operations, as fusekit counts them (0: not counted)


def rotation_sets(bytes_per_set: int) -> int:
    """Sets of bytes_per_set each, at least 2, together more than twice the L2 (as fusekit's runner)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, 2 * l2 // max(bytes_per_set, 1) + 1)


def uniform(shape, dtype, scale=1.0, offset=0.0):
    """offset + scale * uniform[-1, 1), made on the GPU."""
    return (offset + scale * (torch.rand(shape, device="cuda") * 2 - 1)).to(dtype)


def case_name(op: str, shape: str, dtype: str, backward: bool) -> str:
    return f"{op}/{shape}/{dtype}/{'fwd+bwd' if backward else 'fwd'}"
