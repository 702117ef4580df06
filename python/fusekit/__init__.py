"""fusekit's fused CUDA operators inside PyTorch: custom ops with autograd and drop-in patches.

    import fusekit.torch
    report = fusekit.torch.patch(model)   # a Hugging Face BERT or Swin, or timm Swin, in place
    print(report)                         # what was fused, what was left alone and why

This top-level package imports without PyTorch or a GPU (so that tools can ask what is missing);
`fusekit.missing()` lists what stands between this machine and the fused operators.
"""

from fusekit.library import find_library, missing

__all__ = ["find_library", "missing"]
