"""Normalizing the `device` argument the way safetensors and upstream InstantTensor accept it."""

from __future__ import annotations

from typing import Union

import torch

DeviceLike = Union[int, str, torch.device]


def to_device(device: DeviceLike) -> torch.device:
    """int N -> cuda:N (as safetensors); "cpu", "cuda", "cuda:1", torch.device as given.

    Raises ValueError for anything torch cannot parse as a device.
    """
    if isinstance(device, bool):
        raise ValueError(f"device={device!r} is not a device")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device={device} is not a valid device index")
        return torch.device("cuda", device)
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"device={device!r} is not a device: {error}") from None
    raise ValueError(f"device={device!r} is not an int, a string or a torch.device")
