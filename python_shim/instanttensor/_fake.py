"""Fake (meta) kernels: shapes and dtypes from the headers alone, for torch.compile."""

from __future__ import annotations

import torch

from ._dtypes import torch_dtype
from ._errors import engine_errors


@torch.library.register_fake("instanttensor::load_tensors")
def _load_tensors_fake(files: list[str], names: list[str], device: torch.device) -> list[torch.Tensor]:
    # Reads and validates only the headers; the real kernel validates them again when it runs,
    # so a file changed after tracing is an error, not a wrong shape.
    with engine_errors():
        index = torch.classes.instanttensor.Loader(list(files), keys=list(names))
        try:
            specs = [index.get_tensor_metadata(name) for name in names]
        finally:
            index.close()
    return [torch.empty(shape, dtype=torch_dtype(dtype), device=device) for dtype, shape in specs]


@torch.library.register_fake("instanttensor::save_file")
def _save_file_fake(tensors, names, file, metadata_keys, metadata_values, has_metadata) -> None:
    return None


@torch.library.register_fake("instanttensor::load_into_")
def _load_into_fake(destinations, files, names) -> None:
    # Mutates its destinations in place: nothing to create, shapes and dtypes are theirs.
    return None
