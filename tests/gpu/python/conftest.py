"""pytest setup of the PyTorch-side GPU tests: python/ of this checkout and this folder (the
patch tests' shared module, patch_checks) on the path, and exit code 77 (ctest's "skipped") where
there is no GPU, so that no skipped case is counted as a pass."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_sessionstart(session):
    import torch

    if not torch.cuda.is_available():
        pytest.exit("no CUDA device: the fusekit.torch GPU tests did not run", returncode=77)
