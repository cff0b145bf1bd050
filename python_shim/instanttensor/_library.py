"""Loads the native library exactly once, after checking it was built for this torch."""

from __future__ import annotations

import os
import threading

import torch

_lock = threading.Lock()
_loaded_path: str | None = None


def _minor(version: str) -> str:
    """'2.13.0+cpu' -> '2.13': the wheel requires torch==2.13.* (setup.py), so the library
    loads into any patch release of the minor version it was built for."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def library_path() -> str:
    """The one resolved path of libinstanttensor.so inside this package."""
    return os.path.realpath(os.path.join(os.path.dirname(__file__), "libinstanttensor.so"))


def load_library() -> str:
    """Loads libinstanttensor.so into this process (idempotent, thread-safe).

    Raises ImportError naming both versions when the library was built against another torch:
    loading it anyway could crash the process on an ABI mismatch.
    """
    global _loaded_path
    with _lock:
        if _loaded_path is not None:
            return _loaded_path
        try:
            from ._build_info import TORCH_VERSION
        except ImportError as error:  # a source tree that was never built
            raise ImportError(
                "instanttensor's native library is not built; install with "
                "`pip install --no-build-isolation .`"
            ) from error
        if _minor(TORCH_VERSION) != _minor(torch.__version__):
            raise ImportError(
                f"instanttensor was built against torch {TORCH_VERSION} but torch "
                f"{torch.__version__} is running; install the wheel built for torch "
                f"{_minor(torch.__version__)}, or rebuild it with the running torch: "
                "`pip install --no-build-isolation --force-reinstall --no-deps .`"
            )
        path = library_path()
        if not os.path.exists(path):
            raise ImportError(f"instanttensor's native library is missing: {path}")
        torch.ops.load_library(path)
        _loaded_path = path
        return path
