"""instanttensor: safetensors checkpoints into torch tensors at the speed of the storage.

A drop-in for the upstream InstantTensor API (which vLLM's `--load-format instanttensor`
imports) and for safetensors (`instanttensor`, `instanttensor.torch` and `instanttensor.numpy`
carry the public names of `safetensors`, `safetensors.torch` and `safetensors.numpy`), on a C++
engine registered as `torch.ops.instanttensor.*` and `torch.classes.instanttensor.Loader`.
"""

import os as _os

from ._library import load_library

load_library()

from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from ._backends import Backend, BackendPolicy  # noqa: E402
from ._errors import SafetensorError  # noqa: E402
from ._destinations import LoadIntoResult  # noqa: E402
from ._files import _safe_open_handle, load_file, load_into, save_file  # noqa: E402
from ._safe_open import safe_open  # noqa: E402

# Names whose modules load on first use. vLLM imports this package inside its timed weight
# loading, and these modules cost about 1 ms of its import: a loader that only opens and
# iterates never needs them.
_LAZY = {
    "SafeSlice": "._slicing",
    "TensorSpec": "._serialize",
    "deserialize": "._serialize",
    "serialize": "._serialize",
    "serialize_file": "._serialize",
    "load_constants": ".aoti",
}


def __getattr__(name: str):
    if name == "aoti":  # the AOTInductor module, imported on first use
        import importlib

        return importlib.import_module(".aoti", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"aoti"})


# Upstream InstantTensor's API level (0.2.2), with the torch this build is for as a local label
# (0.2.2+torch2.13): the distribution's version, which setup.py wrote beside the library.
from ._build_info import VERSION as __version__  # noqa: E402

UPSTREAM_API_LEVEL = "0.2.2"

# For C++ consumers of an installed wheel, as torch.utils.cmake_prefix_path is for torch: the
# folder find_package(instanttensor) searches (share/cmake/instanttensor inside this package).
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "share", "cmake")

__all__ = [
    "safe_open", "Backend", "BackendPolicy", "SafeSlice", "LoadIntoResult", "load_file",
    "load_into", "save_file", "SafetensorError", "TensorSpec", "serialize", "serialize_file",
    "deserialize", "__version__", "UPSTREAM_API_LEVEL", "cmake_prefix_path", "load_constants",
]
