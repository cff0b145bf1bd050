"""copy=True: small checkpoints read on the caller's thread, and owned tensors reusing the memory of
dropped ones (never of kept ones)."""

from __future__ import annotations

import os

import pytest
import torch

import instanttensor
from conftest import same_bytes


def test_small_checkpoints_read_on_the_callers_thread(model_files):
    """<= 8 MiB selected: no read workers started (their start and join cost more than the
    reads); an explicit concurrency still gets its workers."""
    paths, tensors = model_files

    def threads() -> int:
        # Read workers by their names (ops/io/thread_name.h), not every thread: a kept view's
        # lease starts a watcher thread once per process, whichever test keeps one first.
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except OSError:  # ended meanwhile
                pass
        return sum(name in ("it-read", "it-read-ahead") for name in names)

    before = threads()
    with instanttensor.safe_open(paths) as f:
        it = f.tensors()
        next(it)
        assert threads() == before
        assert len(list(it)) == len(tensors) - 1
        f.get_tensor("embed.weight")
        assert threads() == before
    with instanttensor.safe_open(paths, concurrency=2) as f:
        it = f.tensors()
        next(it)
        assert threads() == before + 2
        list(it)


@pytest.mark.parametrize("backend", ["pread", "direct"])
def test_copy_true_reuses_the_memory_of_dropped_tensors_and_never_of_kept_ones(tmp_path, backend):
    # A model loader copies each tensor into its parameter and drops it: the next tensor is read
    # into that memory instead of fresh pages. Tensors still held are never read over.
    from safetensors.torch import save_file

    torch.manual_seed(1)
    tensors = {}
    for i in range(12):
        tensors[f"layers.{i:02d}.weight"] = torch.randn(768, 1024)  # 3 MiB
        tensors[f"layers.{i:02d}.norm"] = torch.randn(1000).to(torch.bfloat16)
    path = str(tmp_path / "model.safetensors")
    save_file(tensors, path)
    with instanttensor.safe_open(path, copy=True, backend=backend, buffer_size=16 << 20) as f:
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name]), name
            del tensor
        assert f.stats()["recycled_blocks"] > 0
    with instanttensor.safe_open(path, copy=True, backend=backend, buffer_size=16 << 20) as f:
        kept = dict(f.tensors())
        assert f.stats()["recycled_blocks"] == 0
    assert len({t.data_ptr() for t in kept.values()}) == len(tensors)
    for name, tensor in kept.items():
        assert same_bytes(tensor, tensors[name]), name
