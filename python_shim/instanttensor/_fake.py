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


def _eager_call_with_meta_tensors(tensors) -> bool:
    """Whether a Meta-dispatched call came from eager code holding real meta tensors rather than
    from tracing (FakeTensors under a fake mode). A fake kernel is registered as the Meta kernel,
    so eager calls with a meta tensor reach it too; for an operator with effects, returning there
    would be a silent no-op (save_file writing nothing, load_into_ filling nothing)."""
    from torch._subclasses.fake_tensor import is_fake

    return not any(is_fake(t) for t in tensors) and any(t.is_meta for t in tensors)


def _real_kernel(op, *args) -> None:
    """Runs the operator's real (CPU) kernel, which refuses meta tensors with an error naming the
    file and the tensor, before anything is written."""
    with engine_errors():
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args)


@_register_fake("instanttensor::save_file")
def _save_file_fake(tensors, names, file, metadata_keys, metadata_values, has_metadata) -> None:
    if _eager_call_with_meta_tensors(tensors):
        _real_kernel(torch.ops.instanttensor.save_file.default, tensors, names, file,
                     metadata_keys, metadata_values, has_metadata)
        raise AssertionError("save_file accepted a meta tensor")  # the kernel always refuses
    return None


@_register_fake("instanttensor::load_into_")
def _load_into_fake(destinations, files, names) -> None:
    # Mutates its destinations in place: nothing to create, shapes and dtypes are theirs.
    if _eager_call_with_meta_tensors(destinations):
        _real_kernel(torch.ops.instanttensor.load_into_.default, destinations, files, names)
        raise AssertionError("load_into_ filled a meta tensor")  # the kernel always refuses
    return None


def _register_effects() -> None:
    """save_file and serialize_file return nothing and mutate no argument: torch.compile's dead
    code elimination would drop them, a silent no-op. An ordered effect keeps each call, in
    program order. A torch without effect registration traces them as before."""
    register = getattr(_LIBRARY, "_register_effectful_op", None)
    effects = getattr(getattr(torch._library, "effects", None), "EffectType", None)
    if register is None or effects is None:
        return
    for qualname in ("instanttensor::save_file", "instanttensor::serialize_file"):
        register(qualname, effects.ORDERED)


_register_effects()
