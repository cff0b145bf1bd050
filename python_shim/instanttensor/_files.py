"""load_file and save_file, compatible with safetensors.torch."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch

from ._device import DeviceLike
from ._errors import (SafetensorNotImplementedError, SafetensorRuntimeError, SafetensorTypeError,
                      SafetensorValueError, engine_errors)
from ._destinations import LoadIntoResult
from ._paths import PathLike
from ._safe_open import safe_open

_CPU = torch.device("cpu")
# Files up to this size load in one operator call (it returns in well under a second).
_ONE_CALL_BYTES = 1 << 20


def _small_file(path: str) -> bool:
    """Whether `path` is a file of at most _ONE_CALL_BYTES; False where it cannot be looked at
    (safe_open then raises the reference's error for it: one stat either way)."""
    try:
        return os.stat(path).st_size <= _ONE_CALL_BYTES
    except OSError:
        return False


def load_file(filename: PathLike, device: DeviceLike = "cpu", *,
              backend: Any = None) -> dict[str, torch.Tensor]:
    """Every tensor of `filename` as an owned tensor on `device`, in storage order
    (safetensors.torch.load_file; `backend` as safe_open's, e.g. "mmap" or "pread")."""
    if backend is None and (device == "cpu" or device == _CPU) and isinstance(
            filename, (str, os.PathLike)):
        path = os.fspath(filename)
        if _small_file(path):
            # A small file in one call into the engine: no safe_open object, and its tensors
            # read one by one rather than through a pass (plan::choose_load_file_path), whose
            # fixed cost is most of a small file's load. Larger files iterate here, so Ctrl-C
            # is taken between tensors.
            with engine_errors():
                names, tensors = torch.ops.instanttensor.load_file(path, _CPU)
            return dict(zip(names, tensors))
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f._all_tensors()


def load_into(destinations: Mapping[str, torch.Tensor], filename: PathLike | Sequence[PathLike],
              *, strict: bool = True, **options: Any) -> LoadIntoResult:
    """Fills `destinations` (name -> Tensor you own, e.g. `model.state_dict()`) in place from
    `filename` (one file or a list), in one pass; see `safe_open.load_into`. `options` are
    safe_open's (backend=, concurrency=, process_group=, ...); the destinations' own devices
    decide where bytes go.
    """
    with safe_open(filename, framework="pt", **options) as f:
        return f.load_into(destinations, strict=strict)


def check_tensors_to_save(tensors: Any) -> None:
    """safetensors.torch's refusals, in its order and with its messages (callers match them):
    ValueError for a non-dict, a non-tensor value, sparse tensors and non-contiguous tensors,
    RuntimeError for tensors sharing memory, NotImplementedError (a RuntimeError) for meta
    tensors (no bytes to write), TypeError for a non-str name. Each is also a SafetensorError."""
    if not isinstance(tensors, dict):
        raise SafetensorValueError(
            f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise SafetensorTypeError(f"tensor names must be str, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise SafetensorValueError(
                f"Key `{name}` is invalid, expected torch.Tensor but received {type(tensor)}")
        if tensor.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise SafetensorValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not "
            "support. You can make it a dense tensor before saving with `.to_dense()` but be "
            "aware this might make a much larger file than needed.")
    shared = _shared_groups(tensors)
    if shared:
        raise SafetensorRuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential "
            f"differences when loading them again: {shared}. A potential way to correctly save "
            "your model is to use `save_model` (instanttensor.torch.save_model), or clone them.")
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise SafetensorValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. "
                "Call `.contiguous()` on it before saving.")
        if tensor.is_meta:  # NotImplementedError, a RuntimeError, as torch says it
            raise SafetensorNotImplementedError(
                f"Cannot copy out of meta tensor `{name}`: it has no data to save; nothing was "
                "written")


def _shared_groups(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of tensors whose bytes overlap in memory (safetensors refuses to save those), from
    the library's one check (the C++ save_file makes the same)."""
    names = list(tensors)
    flat = torch.ops.instanttensor.shared_tensor_names([tensors[n] for n in names], names)
    return [[flat[i], flat[i + 1]] for i in range(0, len(flat), 2)]


def save_file(
    tensors: dict[str, torch.Tensor],
    filename: PathLike,
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes `tensors` to `filename` as safetensors, byte-identical to safetensors.torch's
    save_file, durably: a temporary file, fsynced, renamed over the name, so a failure or a
    refusal (check_tensors_to_save) leaves the old file intact. Tensors on any device are copied
    to the host while writing."""
    from ._serialize import metadata_lists  # on first use: `import instanttensor` stays cheap

    check_tensors_to_save(tensors)
    keys, values = metadata_lists(metadata)
    names = list(tensors)
    with engine_errors():
        torch.ops.instanttensor.save_file(
            [tensors[n] for n in names], names, os.fspath(filename), keys, values,
            metadata is not None,
        )


def _safe_open_handle(f: Any, framework: str, device: DeviceLike = "cpu", *,
                      backend: Any = None) -> safe_open:
    """safetensors' `_safe_open_handle`: a safe_open over the file behind an open file object
    (a built-in file, an fsspec local file, ...), which must have `fileno()` and a path `name`."""
    name = getattr(f, "name", None)
    if not hasattr(f, "fileno") or not isinstance(name, (str, os.PathLike)):
        raise SafetensorValueError(
            f"_safe_open_handle needs an open local file with a fileno() and a path name, got "
            f"{type(f).__name__}")
    return safe_open(os.fspath(name), framework=framework, device=device, backend=backend)
