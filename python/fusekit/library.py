"""Where the operator library (libfusekit_torch_ops.so, built from torch_ops/) is, and what is
missing for it to load. Plain Python: imported without PyTorch, so it also runs on CPU-only tests.

The library is looked for, in order, at $FUSEKIT_TORCH_OPS_LIBRARY (a file), then in the build
folders of the checkout this package sits in: build-device/torch_ops/, build/torch_ops/.
"""

import importlib.util
import os

LIBRARY_NAME = "libfusekit_torch_ops.so"
ENVIRONMENT_VARIABLE = "FUSEKIT_TORCH_OPS_LIBRARY"
BUILD_FOLDERS = ("build-device", "build")


def checkout_root():
    """The repository root: python/fusekit/library.py is two folders below it."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def candidates(environ=None, root=None):
    """The paths tried, in order."""
    environ = os.environ if environ is None else environ
    root = checkout_root() if root is None else root
    paths = []
    if environ.get(ENVIRONMENT_VARIABLE):
        paths.append(environ[ENVIRONMENT_VARIABLE])
    paths += [os.path.join(root, folder, "torch_ops", LIBRARY_NAME) for folder in BUILD_FOLDERS]
    return paths


def find_library(environ=None, root=None):
    """The first candidate that exists, or None."""
    for path in candidates(environ, root):
        if os.path.isfile(path):
            return path
    return None


def missing(environ=None, root=None, have_module=None):
    """What stands between this machine and fusekit's operators: a list of one-line reasons
    (empty when nothing is missing). have_module(name) -> bool is importlib's by default."""
    have_module = have_module or (lambda name: importlib.util.find_spec(name) is not None)
    reasons = []
    if not have_module("torch"):
        reasons.append("PyTorch is not installed (fusekit.torch needs torch >= 2.4 with CUDA)")
    path = find_library(environ, root)
    if path is None:
        tried = ", ".join(candidates(environ, root))
        reasons.append(
            f"{LIBRARY_NAME} was not found (tried {tried}); build it with scripts/setup.sh on a machine "
            f"with PyTorch, or set {ENVIRONMENT_VARIABLE}"
        )
    return reasons
