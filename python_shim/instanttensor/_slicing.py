"""get_slice: the slice object, and the index rules it applies for framework="np" (the reference
reader's, checked before any read).

An index is an int, a slice with a positive step, `...`, the empty list, or a tuple of those.
Unlike Python's sequences, a slice reaching past its dimension is an error (the reference's
"index N out of bounds for tensor dimension #D of size S"), never clamped. One extension:
negative slice bounds count from the end, as negative ints do (the reference cannot convert
them and raises OverflowError).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

import torch

from ._dtypes import format_name, header_shape
from ._errors import SafetensorIndexError, SafetensorValueError
from ._frameworks import as_framework

if TYPE_CHECKING:
    from ._safe_open import safe_open


class _Narrow(NamedTuple):
    start: Optional[int]  # None: from 0
    stop: Optional[int]  # None: to the dimension's end
    step: int

    def __str__(self) -> str:
        bounds = f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"
        return bounds if self.step == 1 else f"{bounds}:{self.step}"


_Indexer = Union[int, _Narrow]


def _resolved(value: int, dim_index: int, dim: int) -> int:
    if value >= 0:
        return value
    if dim + value < 0:
        raise SafetensorIndexError(f"Invalid index {value} for dimension {dim_index} of size {dim}")
    return dim + value


def _bound(value: Any, dim_index: int, dim: int) -> Optional[int]:
    return None if value is None else _resolved(operator.index(value), dim_index, dim)


def _indexers(index: Any, shape: list[int]) -> list[_Indexer]:
    if isinstance(index, list):
        if index:
            raise SafetensorValueError("Non empty lists are not implemented")
        return [_Narrow(0, 0, 1)]
    items = list(index) if isinstance(index, tuple) else [index]
    ellipses = sum(1 for item in items if item is Ellipsis)
    if ellipses > 1:
        raise SafetensorValueError("Only one ellipsis (...) is allowed in slice index")
    expansion = max(0, len(shape) - (len(items) - ellipses))
    indexers: list[_Indexer] = []
    for item in items:
        position = len(indexers)
        dim = shape[position] if position < len(shape) else 0
        if item is Ellipsis:
            indexers.extend(_Narrow(None, None, 1) for _ in range(expansion))
        elif isinstance(item, slice):
            step = 1 if item.step is None else operator.index(item.step)
            if step <= 0:
                raise SafetensorValueError(f"Slice step must be a positive integer, got {step}")
            indexers.append(_Narrow(_bound(item.start, position, dim),
                                    _bound(item.stop, position, dim), step))
        elif hasattr(item, "__index__"):  # bools too: the reference takes True as 1
            indexers.append(_resolved(operator.index(item), position, dim))
        else:
            raise SafetensorValueError(f"Unsupported slice index at position {position}: "
                                       "expected slice, int, or ellipsis")
    return indexers


def checked_index(index: Any, shape: list[int]) -> tuple:
    """`index` as a tuple of non-negative ints and slices with concrete, in-range bounds (the
    shape of the result is then Python's), or SafetensorError (also IndexError or ValueError) in
    the reference's words, naming the index and the shape."""
    indexers = _indexers(index, shape)
    shown = "[" + ", ".join(str(i) for i in indexers) + "]"
    if len(indexers) > len(shape):
        raise SafetensorIndexError(f"Error during slicing {shown} with shape {shape}: more "
                                   "slicing indexes than dimensions in tensor")
    # The reference checks from the last dimension to the first and reports the first failure.
    for position in reversed(range(len(indexers))):
        dim, indexer = shape[position], indexers[position]
        if isinstance(indexer, int):
            start, stop = indexer, indexer + 1
        else:
            start = 0 if indexer.start is None else indexer.start
            stop = dim if indexer.stop is None else indexer.stop
        if start >= dim or stop > dim:
            asked = start if start >= dim else stop - 1
            raise SafetensorIndexError(
                f"Error during slicing {shown} with shape {shape}: index {asked} out of bounds "
                f"for tensor dimension #{position} of size {dim}")
    out: list[Any] = []
    for position, indexer in enumerate(indexers):
        if isinstance(indexer, int):
            out.append(indexer)
        else:
            start = 0 if indexer.start is None else indexer.start
            stop = shape[position] if indexer.stop is None else indexer.stop
            out.append(slice(start, max(start, stop), indexer.step))
    return tuple(out)


class SafeSlice:
    """safetensors' slice object: shape and dtype without reading, then `[...]` indexing.

    Indexing reads only the rows of dimension 0 that the index touches (one contiguous byte
    range of the file); the rest of the index is applied to those rows.
    """

    def __init__(self, owner: "safe_open", name: str) -> None:
        self._owner = owner
        self._name = name
        self._dtype, self._shape = owner.get_tensor_metadata(name)

    def get_shape(self) -> list[int]:
        # The header's shape, as safetensors gives it: F4 counts unpacked elements, two per byte
        # of the packed float4_e2m1fn_x2 tensor that indexing works on.
        return header_shape(format_name(self._dtype), self._shape)

    def get_dtype(self) -> str:
        return format_name(self._dtype)

    def __getitem__(self, index: Any) -> Any:
        """The indexed part, reading only the rows of dimension 0 the index touches. As the
        reference: framework="pt" follows torch's indexing rules; framework="np" follows the
        reference's own (_slicing.py: a slice past its dimension is a SafetensorError, not
        clamped)."""
        return as_framework(self._index(index), self._owner._framework, self._name)

    def _index(self, index: Any) -> torch.Tensor:
        owner = self._owner
        if owner._meta:
            return owner._tensor(self._name)[index]
        if owner._framework == "np":
            index = checked_index(index, list(self._shape))
        elif not isinstance(index, tuple):
            index = (index,)
        if len(self._shape) == 0 or not index or index[0] is Ellipsis:
            return owner._tensor(self._name)[index]
        first, rest = index[0], index[1:]
        rows = self._shape[0]
        if isinstance(first, int) and not isinstance(first, bool):
            position = first + rows if first < 0 else first
            if not 0 <= position < rows:
                raise SafetensorIndexError(f"tensor {self._name!r}: index {first} is out of bounds "
                                           f"for dimension 0 of size {rows}")
            return owner._rows(self._name, position, position + 1)[(0,) + rest]
        if isinstance(first, slice):
            start, stop, step = first.indices(rows)
            if step > 0:
                stop = max(start, stop)
                last = start + ((stop - start - 1) // step) * step + 1 if stop > start else start
                block = owner._rows(self._name, start, last)
                return block[(slice(None, None, step),) + rest]
        return owner._tensor(self._name)[index]
