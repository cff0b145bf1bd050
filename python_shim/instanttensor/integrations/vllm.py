"""vLLM's weight iterator on the instanttensor engine, with the INSTANTTENSOR_COPY contract.

INSTANTTENSOR_COPY unset or "1": owned tensors. "0": borrowed zero-copy views (of the page cache
on the host, of the loader's buffer on a device), each marked `_vllm_instanttensor_borrowed = True`; a parameter loader consumes them
before asking for the next one. A borrowed tensor kept longer is copied out by the engine before
its memory is reused, so it never changes; keeping it still costs that copy.
"""

from __future__ import annotations

import os
from typing import Any, Generator, Sequence

import torch

from .._safe_open import safe_open

COPY_VARIABLE = "INSTANTTENSOR_COPY"
BORROWED_MARKER = "_vllm_instanttensor_borrowed"


def copy_mode_from_environment() -> bool:
    """True for owned tensors (unset or "1"), False for borrowed ("0"); else ValueError."""
    value = os.environ.get(COPY_VARIABLE)
    if value is None or value == "1":
        return True
    if value == "0":
        return False
    raise ValueError(f"{COPY_VARIABLE}={value!r} is not valid; accepted values: '0' or '1'")


def _is_first_rank(process_group: Any) -> bool:
    """One progress bar per load: rank 0 of the group shows it, as vLLM's own iterators do."""
    if process_group is None:
        return True
    import torch.distributed as dist

    return dist.get_rank(process_group) == 0


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def instanttensor_weights_iterator(
    hf_weights_files: Sequence[str],
    use_tqdm_on_load: bool,
    process_group: Any = None,
    keys: Sequence[str] | None = None,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) over all files, in storage order, as vLLM's loader expects.

    `keys` restricts loading to those tensors (draft and MTP models need a few of a large
    checkpoint); only their bytes are read.
    """
    copy = copy_mode_from_environment()  # before any file is opened
    with safe_open(
        list(hf_weights_files),
        framework="pt",
        device=_default_device(),
        process_group=process_group,
        copy=copy,
        keys=keys,
    ) as f:
        bar = None
        if use_tqdm_on_load and _is_first_rank(process_group):
            from tqdm.auto import tqdm

            bar = tqdm(total=f.total_tensor_size, unit="B", unit_scale=True, unit_divisor=1024,
                       desc="Loading safetensors (instanttensor)")
        try:
            for name, tensor in f.tensors():
                if not copy:
                    setattr(tensor, BORROWED_MARKER, True)
                if bar is not None:
                    bar.update(tensor.nbytes)
                yield name, tensor
                # Hold nothing of the borrowed buffer once the consumer moved on.
                del tensor
        finally:
            if bar is not None:
                bar.close()
