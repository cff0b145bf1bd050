"""Normalizing the `device` argument the way safetensors and upstream InstantTensor accept it."""

from __future__ import annotations

from typing import Any, Union

import torch

from ._errors import SafetensorValueError, engine_errors
from ._library import load_library

DeviceLike = Union[int, str, torch.device]


def to_device(device: DeviceLike) -> torch.device:
    """int N -> cuda:N (as safetensors); "cpu", "cuda", "cuda:1", torch.device as given.

    Raises ValueError for anything torch cannot parse as a device.
    """
    if isinstance(device, bool):
        raise SafetensorValueError(f"device={device!r} is not a device")
    if isinstance(device, int):
        if device < 0:
            raise SafetensorValueError(f"device={device} is not a valid device index")
        return torch.device("cuda", device)
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as error:
            raise SafetensorValueError(f"device={device!r} is not a device: {error}") from None
    raise SafetensorValueError(f"device={device!r} is not an int, a string or a torch.device")


def _device_module(device: torch.device) -> Any:
    """torch's module for an accelerator type (torch.cuda, torch.xpu, a PrivateUse1 backend's
    registered module), or None where torch has none (the engine then decides alone)."""
    if device.type in ("cpu", "meta"):
        return None
    try:
        return torch.get_device_module(device.type)
    except (RuntimeError, AttributeError, ValueError):
        return None


def free_memory_share(max_free_mem_usage: float | None) -> float:
    """The share of free accelerator memory the loader may use: `max_free_mem_usage`, else
    INSTANTTENSOR_MAX_FREE_MEM_USAGE, else 0.5; ValueError naming the one outside (0, 1]. The
    library's one parse of both."""
    load_library()
    given = None if max_free_mem_usage is None else float(max_free_mem_usage)
    with engine_errors():
        return torch.ops.instanttensor.free_memory_share(given)


def resolve_target(device: torch.device, given: Any) -> torch.device:
    """The target with a concrete index (an unindexed accelerator is its current device, read
    now). ValueError naming `given` when the device type is not available in this torch. The
    device memory the loader may use is the engine's to compute (OpenOptions::device_budget:
    max_free_mem_usage of what the device's allocator reports free), for C++ and Python alike."""
    module = _device_module(device)
    if module is None:
        return device
    if not module.is_available():
        kind = "CUDA" if device.type == "cuda" else device.type
        raise SafetensorValueError(f"device={given!r}: {kind} is not available in this torch")
    if device.index is None:
        device = torch.device(device.type, module.current_device())
    return device
