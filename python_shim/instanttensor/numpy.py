"""The safetensors.numpy face: `save`, `save_file`, `load`, `load_file` with numpy arrays.

    from instanttensor.numpy import load_file, save_file   # was: from safetensors.numpy import ...

Arrays are written little-endian whatever their byte order; loading hands out arrays that own
their bytes. Element types are numpy's: bool, (u)int8-64, float16/32/64 and complex64.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

import numpy as np

from ._dtypes import torch_to_format
from ._errors import SafetensorTypeError, SafetensorValueError
from ._safe_open import safe_open
from ._serialize import TensorSpec, deserialize, parse_buffer, serialize, serialize_file  # noqa: F401

__all__ = ["load", "load_file", "save", "save_file"]

def _numpy_types() -> Dict[str, Any]:
    """Format codes -> numpy types, for the engine's dtypes numpy can hold (no bfloat16, float8
    or float4)."""
    types = {}
    for torch_name, code in torch_to_format().items():
        try:
            types[code] = np.dtype(torch_name).type
        except TypeError:
            continue
    return types


_TYPES = _numpy_types()


def _specs(tensor_dict: Dict[str, np.ndarray], keep_alive: List[Any]) -> Dict[str, TensorSpec]:
    """TensorSpecs over little-endian, contiguous forms of the arrays (kept in `keep_alive`)."""
    if not isinstance(tensor_dict, dict):
        raise SafetensorValueError(
            f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    specs = {}
    for name, array in tensor_dict.items():
        if not isinstance(array, np.ndarray):
            raise SafetensorValueError(
                f"Key `{name}` is invalid, expected np.ndarray but received {type(array)}")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # (never for 0-d: it would make them 1-d)
        keep_alive.append(array)
        specs[name] = TensorSpec(dtype=array.dtype.name, shape=list(array.shape),
                                 data_ptr=array.ctypes.data, data_len=array.nbytes)
    return specs


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding the arrays (the reference's layout)."""
    keep_alive: List[Any] = []
    return serialize(_specs(tensor_dict, keep_alive), metadata=metadata)


def save_file(tensor_dict: Dict[str, np.ndarray], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes the arrays to `filename`, durably (the old file stays intact on failure)."""
    keep_alive: List[Any] = []
    serialize_file(_specs(tensor_dict, keep_alive), filename, metadata=metadata)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """Every array of an in-memory safetensors file, each owning a copy of its bytes."""
    parsed = parse_buffer(data)
    result = {}
    for name, dtype_code, shape, begin, end in parsed.entries:
        if dtype_code not in _TYPES:
            raise SafetensorTypeError(
                f"tensor {name!r} has dtype {dtype_code}, which numpy has no type for")
        result[name] = np.frombuffer(bytearray(parsed.view[begin:end]),
                                     dtype=_TYPES[dtype_code]).reshape(shape)
    return result


def load_file(filename: Union[str, os.PathLike], *, backend: Any = None) -> Dict[str, np.ndarray]:
    """Every array of `filename` (owned), through the engine; `backend` as safe_open's."""
    with safe_open(filename, framework="np", backend=backend) as f:
        return f.get_tensors()
