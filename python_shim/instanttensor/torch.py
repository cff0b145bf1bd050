"""The safetensors.torch face: every public name of `safetensors.torch` (0.8), on our engine.

    from instanttensor.torch import load_file, save_file   # was: from safetensors.torch import ...

Signatures, return values, exception types and the messages callers match are the reference's;
every error is also an `instanttensor.SafetensorError`. Loading goes through `safe_open`
(the pipelined engine), saving through the durable writer.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from ._dtypes import torch_dtype_of_format, torch_shape
from ._errors import SafetensorRuntimeError, SafetensorValueError
from ._files import check_tensors_to_save, load_file, save_file
from ._safe_open import safe_open
from ._serialize import TensorSpec, deserialize, parse_buffer, serialize, serialize_file

__all__ = [
    "TensorSpec", "deserialize", "load", "load_file", "load_model", "safe_open", "save",
    "save_file", "save_model", "serialize", "serialize_file", "storage_ptr", "storage_size",
]


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage (0 for storage without memory, e.g. meta)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The byte size of the tensor's whole storage (for meta: the tensor's own bytes)."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the address of the tensor's last element (its data_ptr when empty)."""
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + tensor.element_size()
    return tensor.data_ptr()


def _filter_shared_not_shared(groups: List[Set[str]],
                              state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Splits each group of names on one storage into runs whose byte ranges overlap."""
    result: List[Set[str]] = []
    for group in groups:
        if len(group) < 2:
            result.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        _, stop, name = spans[0]
        result.append({name})
        for start, end, name in spans[1:]:
            if start >= stop:
                result.append({name})
            else:
                result[-1].add(name)
            stop = end
    return result


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Groups of names whose tensors overlap in one storage (same device, address and storage
    size); meta tensors and empty storages share nothing. Sorted as the reference sorts them."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = defaultdict(set)
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta":
            continue
        ptr, size = storage_ptr(tensor), storage_size(tensor)
        if ptr != 0 and size != 0:
            by_storage[(tensor.device, ptr, size)].add(name)
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether the tensor covers its whole storage, from its first byte."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * tensor.element_size() == storage_size(tensor))


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[List[str]] = None,
    discard_names: Optional[List[str]] = None,
) -> Dict[str, List[str]]:
    """{kept name: [names of the same memory to drop]} for every group of shared tensors. The
    kept name covers the whole storage: the first in sorted order, preferring names not in
    `discard_names`, then names in `preferred_names` (the names a file holds, when loading).
    RuntimeError when no name of a group covers its whole storage."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    to_remove: Dict[str, List[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {name for name in group if _is_complete(state_dict[name])}
        if not complete:
            raise SafetensorRuntimeError(
                "Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {group}. None is covering the entire "
                "storage. Refusing to save/load the model since you could be storing much more "
                "memory than needed.")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(group):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


def save_model(model: torch.nn.Module, filename: Union[str, os.PathLike],
               metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True) -> None:
    """Saves `model.state_dict()`, keeping one name per group of shared (tied) tensors; each
    dropped name is recorded in the metadata as `{dropped: kept}` (caller's entries win).
    `force_contiguous` packs non-contiguous tensors; without it they are a ValueError."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            metadata = {} if metadata is None else metadata
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as error:
        raise SafetensorValueError(
            f"{error} Or use save_model(..., force_contiguous=True), read the docs for potential "
            "caveats.") from None


def load_model(model: torch.nn.Module, filename: Union[str, os.PathLike], strict: bool = True,
               device: Union[str, int] = "cpu", *,
               backend: Any = None) -> Tuple[Set[str], List[str]]:
    """Loads `filename` into `model` (shared tensors filled once, through whichever name the file
    holds). Returns (missing, unexpected) names; with `strict`, any of either is a RuntimeError
    listing them, in `Module.load_state_dict`'s words."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=list(state_dict))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing_set = set(missing)
    for dropped in to_removes.values():
        for name in dropped:
            if name in missing_set:
                missing_set.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing_set or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing_set:
            names = ", ".join(f'"{k}"' for k in sorted(missing_set))
            error += f"\n    Missing key(s) in state_dict: {names}"
        if unexpected:
            names = ", ".join(f'"{k}"' for k in sorted(unexpected))
            error += f"\n    Unexpected key(s) in state_dict: {names}"
        raise SafetensorRuntimeError(error)
    return missing_set, unexpected  # a set and a list, as the reference returns them


def _specs(tensors: Dict[str, torch.Tensor], keep_alive: list) -> Dict[str, TensorSpec]:
    """TensorSpecs over host copies of `tensors` (kept in `keep_alive` while they are used)."""
    check_tensors_to_save(tensors)
    specs = {}
    for name, tensor in tensors.items():
        host = tensor.detach().cpu() if tensor.device.type != "cpu" else tensor.detach()
        keep_alive.append(host)
        specs[name] = TensorSpec(dtype=str(host.dtype).removeprefix("torch."),
                                 shape=list(host.shape), data_ptr=host.data_ptr(),
                                 data_len=host.nelement() * host.element_size())
    return specs


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes `save_file` would write (the reference's layout, byte for byte)."""
    keep_alive: list = []
    return serialize(_specs(tensors, keep_alive), metadata=metadata)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Every tensor of an in-memory safetensors file, each owning a copy of its bytes, on the
    CPU, in storage order. SafetensorError (also ValueError) for a malformed buffer."""
    parsed = parse_buffer(data)
    result = {}
    for name, dtype_code, shape, begin, end in parsed.entries:
        dtype = torch_dtype_of_format(dtype_code)
        shape = torch_shape(dtype_code, shape)
        if end == begin:
            result[name] = torch.empty(shape, dtype=dtype)
        else:
            storage = torch.frombuffer(bytearray(parsed.view[begin:end]), dtype=torch.uint8)
            result[name] = storage.view(dtype).reshape(shape)
    return result
