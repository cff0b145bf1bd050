"""The mmap backend: views of a private file mapping, copy=True owning its bytes, never chosen by auto."""

from __future__ import annotations

import os

import pytest
import torch

import instanttensor
from conftest import same_bytes


def _mapping_of(path: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `path` (from /proc/self/maps)."""
    ranges = []
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == real:
                begin, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((begin, end))
    return ranges


def test_mmap_views_equal_the_reference_point_into_the_mapping_and_outlive_close(model_files):
    paths, tensors = model_files
    kept = {}
    with instanttensor.safe_open(paths, copy=False, backend="mmap") as f:
        assert f.stats()["backend"] == "mmap"
        for name, tensor in f.tensors():
            kept[name] = tensor
        random = f.get_tensor("lm_head.weight")
        rows = f.get_slice("embed.weight")[3:9]
        stats = f.stats()
    assert stats["bytes_read"] == 0 and stats["materializations"] == 0  # no reads, no ring
    mapped = [r for p in paths for r in _mapping_of(p)]
    assert mapped, "the files are not mapped"
    for name, tensor in {**kept, "random": random, "rows": rows}.items():
        pointer = tensor.data_ptr()
        assert any(begin <= pointer < end for begin, end in mapped), name
    for name, tensor in kept.items():  # after close: the storages keep the mapping alive
        assert same_bytes(tensor, tensors[name]), name
    assert same_bytes(random, tensors["lm_head.weight"])
    assert torch.equal(rows, tensors["embed.weight"][3:9])
    del kept, random, rows, tensor
    import gc
    gc.collect()
    assert not [r for p in paths for r in _mapping_of(p)], "the mapping outlived its last view"


def test_mmap_views_are_copy_on_write_never_the_file(model_files):
    paths, tensors = model_files
    before = open(paths[0], "rb").read()
    with instanttensor.safe_open(paths, copy=False, backend="mmap") as f:
        embed = f.get_tensor("embed.weight")
        embed.mul_(2)  # an in-place op on a loaded weight: private pages, no crash
        assert torch.equal(embed, tensors["embed.weight"] * 2)
        # One private mapping per open, as safetensors has: later views of it see the write.
        assert torch.equal(f.get_tensor("embed.weight"), embed)
    assert open(paths[0], "rb").read() == before
    with instanttensor.safe_open(paths, copy=False, backend="mmap") as f:
        assert same_bytes(f.get_tensor("embed.weight"), tensors["embed.weight"])


@pytest.mark.parametrize("device_kind", ["cpu", "staged"])
def test_mmap_copy_true_owns_its_bytes(model_files, device_kind):
    paths, tensors = model_files
    options = {"_force_staging": True} if device_kind == "staged" else {}
    with instanttensor.safe_open(paths, copy=True, backend="mmap", **options) as f:
        loaded = dict(f.tensors())
        stats = f.stats()
    # Iteration hands out views of the page cache; once the pass moves past them, kept ones stay
    # views under a lease on the file (made private before any writer may change it) or owned.
    assert stats["backend"].startswith("mmap")  # staged: the read path copies from the mapping
    assert stats["bytes_read"] == sum(t.nbytes for t in tensors.values())
    mapped = [r for p in paths for r in _mapping_of(p)]
    in_mapping = [n for n, t in loaded.items() if any(b <= t.data_ptr() < e for b, e in mapped)]
    assert len(in_mapping) == stats["leased_views"]
    for path in paths:
        os.truncate(path, 0)  # a writer: waits until leased views are private copies
    for name, tensor in loaded.items():
        assert same_bytes(tensor, tensors[name]), name


def test_auto_never_maps(model_files):
    paths, _ = model_files
    with instanttensor.safe_open(paths, copy=False) as f:
        list(f.tensors())
        assert "mmap" not in f.stats()["backend"]


def test_mmap_from_the_environment(model_files, monkeypatch):
    paths, tensors = model_files
    monkeypatch.setenv("INSTANTTENSOR_BACKEND", "mmap")
    loaded = instanttensor.load_file(paths[0])
    for name, tensor in loaded.items():
        assert same_bytes(tensor, tensors[name])
