"""Fake (meta) kernels: shapes and dtypes from the headers alone, for torch.compile."""

from __future__ import annotations

import inspect

import torch

from ._dtypes import torch_dtype
from ._errors import engine_errors

_LIBRARY = torch.library.Library("instanttensor", "FRAGMENT")


def _register_fake(qualname: str):
    """torch.library.register_fake, without the caller lookup it makes for its messages.

    That lookup (inspect.getframeinfo and inspect.getmodule) resolves the path of every module
    imported so far, once per process: 40 ms of `import instanttensor` inside a vLLM worker, most
    of a small model's load time. Here the kernel goes straight into the registry that
    register_fake fills, through the same Library.impl(..., "Meta") call, and the handle is kept
    by the library as register_fake keeps it. Any torch where that route is missing, or where
    it did not leave a Meta kernel, takes the public call instead.
    """

    def register(kernel):
        handle = _register_in_the_registry(qualname, kernel)
        if handle is not None and _has_meta_kernel(qualname):
            getattr(_LIBRARY, "_registration_handles", []).append(handle)
            return kernel
        if handle is not None and hasattr(handle, "destroy"):
            handle.destroy()
        return torch.library.register_fake(qualname)(kernel)

    return register


def _register_in_the_registry(qualname: str, kernel):
    """The registration handle, or None where this torch has no such registry."""
    registry = getattr(getattr(torch._library, "simple_registry", None), "singleton", None)
    entry = getattr(registry, "find", lambda _: None)(qualname)
    add = getattr(getattr(entry, "fake_impl", None), "register", None)
    if add is None or "lib" not in inspect.signature(add).parameters:
        return None
    try:
        return add(kernel, f"{__file__}:{kernel.__code__.co_firstlineno}", lib=_LIBRARY)
    except TypeError:  # another signature under the same names
        return None


def _has_meta_kernel(qualname: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta")


@_register_fake("instanttensor::load_tensors")
def _load_tensors_fake(files: list[str], names: list[str], device: torch.device) -> list[torch.Tensor]:
    # Reads and validates only the headers; the real kernel validates them again when it runs,
    # so a file changed after tracing is an error, not a wrong shape.
    with engine_errors():
        index = torch.classes.instanttensor.Loader(list(files), keys=list(names))
        try:
            specs = [index.get_tensor_metadata(name) for name in names]
        finally:
            index.close()
    return [torch.empty(shape, dtype=torch_dtype(dtype), device=device) for dtype, shape in specs]


@_register_fake("instanttensor::save_file")
def _save_file_fake(tensors, names, file, metadata_keys, metadata_values, has_metadata) -> None:
    return None


@_register_fake("instanttensor::load_into_")
def _load_into_fake(destinations, files, names) -> None:
    # Mutates its destinations in place: nothing to create, shapes and dtypes are theirs.
    return None
