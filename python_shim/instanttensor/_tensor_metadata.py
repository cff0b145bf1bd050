"""Tensor metadata (dtype, shape) of an open engine, asked for all selected tensors at once."""

from __future__ import annotations

from typing import Any

import torch

from ._dtypes import torch_dtype

# Files with more tensors have their metadata asked name by name: one call for all of 100k names
# would cost more than a client asking for a few of them saves.
KNOWN_METADATA_LIMIT = 16384


def known_metadata(engine: Any) -> dict[str, tuple[torch.dtype, torch.Size]]:
    """Every selected tensor's (dtype, shape) by name, asked of the engine in one call (a call
    costs about 4 us; transformers' from_pretrained asks for every key's through get_slice);
    empty when more than KNOWN_METADATA_LIMIT tensors are selected."""
    names, dtypes, shapes = engine.all_tensor_metadata(KNOWN_METADATA_LIMIT)
    return {name: (torch_dtype(dtype), torch.Size(shape))
            for name, dtype, shape in zip(names, dtypes, shapes)}
