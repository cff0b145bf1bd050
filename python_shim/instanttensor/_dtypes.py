"""Names of element types: torch attribute names <-> safetensors header names.

The table itself is the library's (ops/format/torch_dtype.cpp), asked for once through
torch.ops.instanttensor.dtype_table, so the Python package never disagrees with the engine.
"""

from __future__ import annotations

import functools

import torch

from ._library import load_library


@functools.cache
def torch_to_format() -> dict[str, str]:
    """torch dtype attribute name ('bfloat16') -> safetensors dtype name ('BF16')."""
    load_library()
    torch_names, format_names = torch.ops.instanttensor.dtype_table()
    return dict(zip(torch_names, format_names))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an attribute name such as 'bfloat16'."""
    return getattr(torch, name)


def format_name(dtype: torch.dtype) -> str:
    """The safetensors name ('BF16') of a torch dtype."""
    return torch_to_format()[str(dtype).removeprefix("torch.")]


@functools.cache
def _format_to_torch() -> dict[str, str]:
    return {format_code: torch_name for torch_name, format_code in torch_to_format().items()}


def torch_dtype_of_format(code: str) -> torch.dtype:
    """The torch dtype of a safetensors name ('BF16' -> torch.bfloat16)."""
    return getattr(torch, _format_to_torch()[code])


# float4_e2m1fn_x2 packs two F4 values in a byte: the header's last dimension counts values, the
# torch tensor's counts bytes. The one place both directions are written.
_PACKED = {"F4": 2}


def header_shape(code: str, torch_shape: list[int]) -> list[int]:
    """The header's shape for a tensor of format dtype `code` ('F4') and torch shape."""
    shape = list(torch_shape)
    if code in _PACKED and shape:
        shape[-1] *= _PACKED[code]
    return shape


def torch_shape(code: str, header: list[int]) -> list[int]:
    """The torch shape of a header entry of format dtype `code` and shape `header`."""
    shape = list(header)
    if code in _PACKED and shape:
        shape[-1] //= _PACKED[code]
    return shape
