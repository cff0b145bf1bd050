"""safetensors' byte-level API: TensorSpec, serialize, serialize_file, deserialize.

The header rules live once, in the engine (ops/format: the writer orders, aligns and pads; the
parser validates to the reference reader's rules). This module only describes tensors to it and
joins bytes.
"""

from __future__ import annotations

import ctypes
import operator
import os
import struct
from typing import Any, Mapping, NamedTuple, Sequence

import torch

from ._errors import SafetensorTypeError, SafetensorValueError, engine_errors
from ._library import load_library
from ._dtypes import header_shape, torch_to_format
from ._paths import PathLike


# The reference's cap on the header length; deserialize copies at most this much of a buffer.
_MAX_HEADER_BYTES = 100_000_000


class TensorSpec:
    """One tensor for `serialize` / `serialize_file`: `TensorSpec(dtype=, shape=, data_ptr=,
    data_len=)`, as the reference's.

    `dtype` is a constructor-style name ("float32", "bfloat16", ...; SafetensorError for any other)
    and reads back as its format code ("F32"). `shape` is the logical shape; for the packed
    "float4_e2m1fn_x2" the storage shape a framework reports is given and its last dimension is
    doubled. `data_ptr` is a raw address of `data_len` contiguous little-endian bytes: the caller
    keeps that memory alive and unchanged while a serialize call that uses the spec runs.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Sequence[int], data_ptr: int, data_len: int) -> None:
        # Constructor-style names (numpy's and torch's attribute names): the engine's table.
        names = torch_to_format()
        code = names.get(dtype) if isinstance(dtype, str) else None
        if code is None:
            raise SafetensorValueError(
                f"Unknown dtype {dtype!r}. Supported dtypes: {', '.join(names)}")
        dims = header_shape(code, [_non_negative("shape", d) for d in shape])
        self._dtype = code
        self._shape = dims
        self._data_ptr = _non_negative("data_ptr", data_ptr)
        self._data_len = _non_negative("data_len", data_len)

    @property
    def dtype(self) -> str:
        """The format code written in the header ("F32", "BF16", ...)."""
        return self._dtype

    @property
    def shape(self) -> list[int]:
        """The logical shape recorded in the header."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        return self._data_ptr

    @property
    def data_len(self) -> int:
        return self._data_len

    def __repr__(self) -> str:
        return (f"TensorSpec(dtype='{self._dtype}', shape={self._shape}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _non_negative(what: str, value: Any) -> int:
    """`value` as an int (anything with __index__, numpy integers too); TypeError otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        number = -1
    if isinstance(value, bool) or number < 0:
        raise SafetensorTypeError(f"TensorSpec {what} must be a non-negative int, got {value!r}")
    return number


class _Described(NamedTuple):
    names: list[str]
    dtypes: list[str]
    ranks: list[int]
    dims: list[int]
    metadata_keys: list[str]
    metadata_values: list[str]
    has_metadata: bool


def _describe(tensor_dict: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None,
              function: str) -> _Described:
    """The engine's parallel lists; TypeError (also SafetensorError) for anything but a dict of
    str -> TensorSpec and str -> str metadata, as the reference."""
    if not isinstance(tensor_dict, Mapping):
        raise SafetensorTypeError(f"{function}: tensor_dict must be a dict of str -> TensorSpec, "
                                  f"not {type(tensor_dict).__name__}")
    names, dtypes, ranks, dims = [], [], [], []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise SafetensorTypeError(f"{function}: tensor names must be str, got {name!r}")
        if not isinstance(spec, TensorSpec):
            raise SafetensorTypeError(
                f"{function}: {name!r} is a {type(spec).__name__}, not a TensorSpec (raw dicts "
                "are not accepted since safetensors 0.8)")
        names.append(name)
        dtypes.append(spec.dtype)
        ranks.append(len(spec.shape))
        dims.extend(spec.shape)
    keys, values = metadata_lists(metadata)
    return _Described(names, dtypes, ranks, dims, keys, values, metadata is not None)


def metadata_lists(metadata: Any) -> tuple[list[str], list[str]]:
    """(keys, values) of str -> str metadata as the engine takes it (empty for None); TypeError
    (also SafetensorError) otherwise, as the reference. Every writer's one check."""
    if metadata is None:
        return [], []
    if not isinstance(metadata, Mapping):
        raise SafetensorTypeError(
            f"metadata must be a dict of str -> str, not {type(metadata).__name__}")
    keys: list[str] = []
    values: list[str] = []
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SafetensorTypeError(f"metadata must map str to str, got {key!r}: {value!r}")
        keys.append(key)
        values.append(value)
    return keys, values


def _spec_bytes(spec: TensorSpec) -> Any:
    """The spec's memory as a buffer, without copying (empty for zero bytes)."""
    if spec.data_len == 0:
        return b""
    if spec.data_ptr == 0:
        raise SafetensorValueError(f"TensorSpec with {spec.data_len} bytes at address 0")
    return (ctypes.c_char * spec.data_len).from_address(spec.data_ptr)


def serialize(tensor_dict: Mapping[str, TensorSpec],
              metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding `tensor_dict` (the reference's layout: sorted by
    alignment then name, header padded to 8). One copy of the data, into the result."""
    load_library()
    described = _describe(tensor_dict, metadata, "serialize")
    specs = list(tensor_dict.values())
    with engine_errors():
        header, order = torch.ops.instanttensor.serialize_header(
            described.names, described.dtypes, described.ranks, described.dims,
            [s.data_len for s in specs], described.metadata_keys, described.metadata_values,
            described.has_metadata, "<serialize>")
    text = header.encode("utf-8")
    parts = [struct.pack("<Q", len(text)), text]
    parts.extend(_spec_bytes(specs[i]) for i in order)
    return b"".join(parts)


def serialize_file(tensor_dict: Mapping[str, TensorSpec], filename: PathLike,
                   metadata: Mapping[str, str] | None = None) -> None:
    """Writes `tensor_dict` to `filename` as `serialize` lays it out, durably (a temporary file,
    fsynced, renamed over the name: a failure leaves the old file intact). The GIL is released
    while writing."""
    load_library()
    described = _describe(tensor_dict, metadata, "serialize_file")
    data = []
    for spec in tensor_dict.values():
        memory = _spec_bytes(spec)
        data.append(torch.frombuffer(memory, dtype=torch.uint8) if spec.data_len
                    else torch.empty(0, dtype=torch.uint8))
    with engine_errors():
        torch.ops.instanttensor.serialize_file(
            data, described.names, described.dtypes, described.ranks, described.dims,
            os.fspath(filename), described.metadata_keys, described.metadata_values,
            described.has_metadata)


class ParsedBuffer(NamedTuple):
    """An in-memory file's header: entries in storage order and the metadata (None if absent)."""

    entries: list[tuple[str, str, list[int], int, int]]  # name, format dtype, shape, begin, end
    metadata: dict[str, str] | None
    view: memoryview  # the whole buffer, as unsigned bytes


def parse_buffer(data: Any, label: str = "<bytes>") -> ParsedBuffer:
    """Validates the header of the safetensors file held in `data` (bytes-like) to the reader's
    rules and returns its entries with absolute byte offsets. Copies only the header."""
    load_library()
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise SafetensorTypeError(
            f"expected the bytes of a safetensors file, got {type(data).__name__}") from None
    length = struct.unpack_from("<Q", view)[0] if len(view) >= 8 else 0
    # Only the header is copied; a length over the cap is refused by the parser from the prefix.
    head_size = min(len(view), 8 + length if length <= _MAX_HEADER_BYTES else 8)
    head = (torch.frombuffer(bytearray(view[:head_size]), dtype=torch.uint8) if head_size
            else torch.empty(0, dtype=torch.uint8))
    with engine_errors():
        (names, dtypes, ranks, dims, begins, ends, has_metadata, keys, values,
         data_start) = torch.ops.instanttensor.parse_header_bytes(head, len(view), label)
    entries, next_dim = [], 0
    for name, dtype, rank, begin, end in zip(names, dtypes, ranks, begins, ends):
        entries.append((name, dtype, list(dims[next_dim:next_dim + rank]), data_start + begin,
                        data_start + end))
        next_dim += rank
    return ParsedBuffer(entries, dict(zip(keys, values)) if has_metadata else None, view)


def deserialize(data: Any) -> list[tuple[str, dict[str, Any]]]:
    """[(name, {"shape": [...], "dtype": "F32", "data": bytearray}), ...] in storage order, as
    the reference's; SafetensorError (also ValueError) naming the rule a malformed buffer breaks."""
    parsed = parse_buffer(data)
    return [(name, {"shape": shape, "dtype": dtype, "data": bytearray(parsed.view[begin:end])})
            for name, dtype, shape, begin, end in parsed.entries]
