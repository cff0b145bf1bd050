"""Names of element types: torch attribute names <-> safetensors header names."""

from __future__ import annotations

import torch

# torch dtype attribute name -> safetensors dtype name
TORCH_TO_FORMAT: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float4_e2m1fn_x2": "F4",
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an attribute name such as 'bfloat16'."""
    return getattr(torch, name)


def format_name(dtype: torch.dtype) -> str:
    """The safetensors name ('BF16') of a torch dtype."""
    return TORCH_TO_FORMAT[str(dtype).removeprefix("torch.")]
