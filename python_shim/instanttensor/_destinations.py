"""load_into's side of the API: the destinations checked into the engine's two lists, and what
it reports back."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import torch

from ._errors import SafetensorTypeError


class LoadIntoResult(NamedTuple):
    """What load_into(strict=False) left unfilled, as Module.load_state_dict reports it."""

    missing_keys: list[str]  # destinations with no tensor of that name in the checkpoint
    unexpected_keys: list[str]  # tensors of the checkpoint with no destination


def destination_lists(destinations: Any) -> tuple[list[str], list[torch.Tensor]]:
    """Names and detached tensors of a name -> Tensor mapping (a state_dict); TypeError naming
    the first value that is not a tensor."""
    if not isinstance(destinations, Mapping):
        raise SafetensorTypeError("destinations must be a mapping of name -> Tensor "
                                  f"(a state_dict), not {type(destinations).__name__}")
    names, tensors = [], []
    for name, tensor in destinations.items():
        if not isinstance(tensor, torch.Tensor):
            raise SafetensorTypeError(f"destination {name!r} is a {type(tensor).__name__}, "
                                      "not a torch.Tensor")
        names.append(name)
        tensors.append(tensor.detach())
    return names, tensors
