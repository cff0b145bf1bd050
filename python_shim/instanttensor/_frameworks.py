"""`framework=`: which array type safe_open hands out ("pt" -> torch.Tensor, "np" -> numpy)."""

from __future__ import annotations

from typing import Any

import torch

from ._errors import SafetensorTypeError, SafetensorValueError

_SPELLINGS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}
# The reference's other frameworks: named in the error, so a caller knows what is not built.
_NOT_SUPPORTED = {"tf", "tensorflow", "jax", "flax", "mlx", "paddle"}


def framework_of(name: Any) -> str:
    """"pt" or "np" for the reference's spellings of torch and numpy; SafetensorError (also
    ValueError) naming the supported ones for any other."""
    if isinstance(name, str) and name.lower() in _SPELLINGS:
        return _SPELLINGS[name.lower()]
    supported = "'pt' (also 'torch', 'pytorch') and 'np' (also 'numpy')"
    if isinstance(name, str) and name.lower() in _NOT_SUPPORTED:
        raise SafetensorValueError(f"framework={name!r} is not supported by instanttensor; "
                                   f"supported: {supported}")
    raise SafetensorValueError(f"framework {name!r} is invalid; supported: {supported}")


def as_framework(tensor: torch.Tensor, framework: str, name: str) -> Any:
    """`tensor` as the framework's array: itself for "pt"; for "np" a numpy array sharing its
    memory (owned tensors only reach here), SafetensorError (also TypeError) for an element type
    numpy has no type for (bfloat16, float8, float4)."""
    if framework == "pt":
        return tensor
    try:
        return tensor.numpy()
    except TypeError:
        raise SafetensorTypeError(
            f"tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}, which numpy "
            "has no type for; open it with framework='pt'") from None
