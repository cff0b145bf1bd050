"""Tensor metadata (dtype, shape) of an open engine, asked for all selected tensors at once."""

from __future__ import annotations

from typing import Any

import torch

from ._dtypes import torch_dtype
from ._errors import raise_translated

# Checkpoints with more tensors have their metadata asked name by name: the first call, which
# asks for all, costs about 1.4 ms at 1024 tensors (a name alone: 8-12 us, so 120 names repay
# it), 10 ms at 4096 and 50 ms at 16384, which a client asking for a few names would pay.
KNOWN_METADATA_LIMIT = 1024


def known_metadata(engine: Any) -> dict[str, tuple[torch.dtype, torch.Size]]:
    """Every selected tensor's (dtype, shape) by name, asked of the engine in one call (a call
    costs about 4 us; transformers' from_pretrained asks for every key's through get_slice);
    empty when more than KNOWN_METADATA_LIMIT tensors are selected."""
    # A try block, not engine_errors()'s generator, which costs as much as the answer.
    try:
        names, dtypes, shapes = engine.all_tensor_metadata(KNOWN_METADATA_LIMIT)
    except RuntimeError as error:
        raise_translated(error)
    return {name: (torch_dtype(dtype), torch.Size(shape))
            for name, dtype, shape in zip(names, dtypes, shapes)}


def metadata_of(engine: Any, name: str) -> tuple[torch.dtype, torch.Size]:
    """One tensor's (dtype, shape), asked of the engine: KeyError for a name not selected,
    ValueError for a dtype torch lacks."""
    try:
        dtype, shape = engine.get_tensor_metadata(name)
    except RuntimeError as error:
        raise_translated(error)
    return torch_dtype(dtype), torch.Size(shape)
