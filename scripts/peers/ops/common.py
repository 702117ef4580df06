"""What every operator's peer module shares: the case record, rotation and the input makers."""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class PeerCase:
    """One listed case made ready to time: named exactly as fusekit lists it, so variants line up."""
    name: str                   # "<op>/<shape>/<dtype>/<fwd|fwd+bwd>", from the listing
    sets: int                   # rotated input sets
    make_step: Callable         # make_step(fn) -> step(set_index); fn is the eager or compiled function
    function: Callable          # the eager function; torch.compile wraps it
    backward: bool
    release: Optional[Callable] = None  # frees the inputs
    # After a variant's timed samples: numbers stored with its result (suites/peers.h "metrics"),
    # e.g. {"peak_memory_bytes": ...}.
    metrics: Optional[Callable] = None
    # Variants of this case beyond --variants' (e.g. "fusekit", "fusekit-compile": the model patched
    # by fusekit.torch, eager and compiled); a case that has any takes make_step(fn, variant).
    extra_variants: tuple = ()


def rotation_sets(bytes_per_set: int) -> int:
    """Sets of bytes_per_set each, at least 2, together more than twice the L2 (as fusekit's runner)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, 2 * l2 // max(bytes_per_set, 1) + 1)


def uniform(shape, dtype, scale=1.0, offset=0.0):
    """offset + scale * uniform[-1, 1), made on the GPU."""
    return (offset + scale * (torch.rand(shape, device="cuda") * 2 - 1)).to(dtype)

