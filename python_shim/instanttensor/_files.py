"""load_file and save_file, compatible with safetensors.torch."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence, Union

import torch

from ._device import DeviceLike
from ._errors import engine_errors
from ._safe_open import LoadIntoResult, safe_open

PathLike = Union[str, "os.PathLike[str]"]


def load_file(filename: PathLike, device: DeviceLike = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of `filename` as an owned tensor on `device`, in storage order."""
    with safe_open(filename, framework="pt", device=device) as f:
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
    """Writes `tensors` to `filename` as safetensors (readable by the reference reader).

    Refuses, as safetensors does: non-tensors and non-contiguous tensors (ValueError), tensors
    sharing memory (RuntimeError), non-string metadata (ValueError).
    """
    if not isinstance(tensors, dict):
        raise ValueError(f"tensors must be a dict of str -> Tensor, not {type(tensors).__name__}")
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.layout != torch.strided:
            raise ValueError(f"{name!r} has layout {tensor.layout}; only dense tensors are saved")
        if not tensor.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: {name!r}; "
                "call .contiguous() before saving"
            )
    shared = _shared_groups(tensors)
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk: {shared}; "
            "clone them before saving"
        )
    keys: list[str] = []
    values: list[str] = []
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata must map str to str, got {key!r}: {value!r}")
            keys.append(key)
            values.append(value)
    names = list(tensors)
    with engine_errors():
        torch.ops.instanttensor.save_file(
            [tensors[n] for n in names], names, os.fspath(filename), keys, values,
            metadata is not None,
        )
