"""What safe_open's arguments become before any I/O: the file list, the target device, and the
engine's keyword arguments, each validated with the reference's errors."""

from __future__ import annotations

import errno
import os
from typing import Any, NamedTuple, Sequence

import torch

from ._backends import backend_argument
from ._device import DeviceLike, resolve_target, to_device
from ._errors import SafetensorFileNotFoundError, SafetensorValueError
from ._paths import PathLike

# Device types the reference accepts by name that torch parses only with their extension loaded.
_EXTENSION_DEVICES = ("npu", "mlu", "musa")


def file_list(filename: PathLike | Sequence[PathLike]) -> list[str]:
    """One path or many, as a new list of strings (the caller's is never sorted in place)."""
    if isinstance(filename, (str, os.PathLike)):
        return [os.fspath(filename)]
    paths = [os.fspath(f) for f in filename]
    if not paths:
        raise SafetensorValueError("safe_open needs at least one file")
    return paths


def refuse_missing_files(paths: list[str]) -> None:
    """FileNotFoundError in the reference's words (which callers match) for the first path
    that does not exist; one we may not look at (EACCES, ...) is left to the engine's open."""
    for path in paths:
        try:
            os.lstat(path)
        except FileNotFoundError:
            missing = SafetensorFileNotFoundError(f"No such file or directory: {path}")
            missing.errno = errno.ENOENT
            raise missing from None
        except OSError:
            pass


def optional_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SafetensorValueError(f"{name}={value!r} must be a positive integer")
    if value <= 0:
        raise SafetensorValueError(f"{name}={value} must be a positive integer")
    return value


def boxed_group(process_group: Any) -> Any:
    """The group as the engine takes it (a c10d ProcessGroup script object), or None for a
    single process."""
    if process_group is None:
        return None
    import torch.distributed as dist

    if dist.get_world_size(process_group) <= 1:
        return None
    return process_group.boxed()


class OpenTarget(NamedTuple):
    """Where tensors go: `device` is what the engine opens on (the CPU for meta and for a device
    this torch cannot reach); `error`, raised when a tensor is asked, for the latter."""

    device: torch.device
    meta: bool
    error: ValueError | None


def open_target(device: DeviceLike, framework: str) -> OpenTarget:
    try:
        target = to_device(device)
    except ValueError as error:
        # Devices the reference names though torch knows them only once their extension is
        # loaded (npu, mlu, musa): as absent accelerators, they fail at the first tensor.
        if not (isinstance(device, str) and device.split(":")[0] in _EXTENSION_DEVICES):
            raise
        target, unknown_device = torch.device("cpu"), error
    else:
        unknown_device = None
    if framework == "np" and (target.type != "cpu" or unknown_device):
        raise SafetensorValueError(f"Device {device} is not supported for framework "
                                   f"{framework}: numpy arrays live on the CPU")
    # device="meta": shapes only, nothing read. An accelerator this torch cannot reach opens
    # (names, metadata and slices' shapes work) and raises when a tensor is asked, as the
    # reference's lazy device does.
    meta = target.type == "meta"
    if meta or unknown_device:
        return OpenTarget(torch.device("cpu"), meta, unknown_device)
    try:
        return OpenTarget(resolve_target(target, device), False, None)
    except ValueError as error:
        return OpenTarget(torch.device("cpu"), False, error)


def engine_arguments(*, copy: bool, buffer_size: Any, chunk_size: Any, concurrency: Any,
                     io_depth: Any, backend: Any, process_group: Any, staging_size: Any,
                     max_free_mem_usage: Any, host_fallback: bool, force_staging: bool,
                     exchange: Any) -> dict[str, Any]:
    """The engine Loader's keyword arguments but the selection (which may read the headers)."""
    return dict(
        copy=bool(copy),
        buffer_size=optional_int("buffer_size", buffer_size),
        chunk_size=optional_int("chunk_size", chunk_size),
        concurrency=optional_int("concurrency", concurrency),
        io_depth=optional_int("io_depth", io_depth),
        backend=backend_argument(backend),
        process_group=boxed_group(process_group),
        staging_size=optional_int("staging_size", staging_size),
        max_free_mem_usage=None if max_free_mem_usage is None else float(max_free_mem_usage),
        host_fallback=bool(host_fallback),
        force_staging=bool(force_staging),
        exchange=None if exchange is None else str(exchange),
    )
