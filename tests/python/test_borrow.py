"""Borrowed tensors (copy=False) from Python: zero-copy while consumed, never corrupted when kept."""

from __future__ import annotations

import os

import torch

import instanttensor
from conftest import same_bytes


def test_views_are_zero_copy_inside_one_bounded_buffer(model_files):
    paths, tensors = model_files
    # A named read backend: the ring (auto hands out views of the page cache on the host,
    # tests/python/test_page_cache_views.py).
    with instanttensor.safe_open(paths, copy=False, buffer_size=64 << 10, backend="pread") as f:
        pointers = []
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name])
            pointers.append(tensor.data_ptr())
        # Every view lies inside one region no larger than the buffer: no per-tensor allocation.
        assert max(pointers) - min(pointers) < f.buffer_size
        stats = f.stats()
        assert stats["materializations"] == 0
        assert stats["peak_pool_bytes"] <= f.buffer_size
        assert f.copy is False


def test_touching_the_python_storage_object_costs_a_copy_not_a_wrong_byte(model_files):
    # torch keeps a storage's Python wrapper alive (with a strong reference) while other C++
    # references exist, so the loader cannot tell it from a consumer's reference: such tensors
    # are copied out (or kept under a lease on the file) before their memory is reused.
    # Documented; correctness is what matters.
    paths, tensors = model_files
    with instanttensor.safe_open(paths, copy=False, buffer_size=16 << 10) as f:
        for name, tensor in f.tensors():
            assert tensor.untyped_storage().nbytes() == tensor.nbytes
        kept = dict(f.tensors())
        stats = f.stats()
        assert stats["materializations"] + stats["leased_views"] > 0
    for name, tensor in kept.items():
        assert same_bytes(tensor, tensors[name])


def test_retained_borrowed_tensors_still_match_after_iteration(model_files):
    paths, tensors = model_files
    largest = max(t.nbytes for t in tensors.values())
    with instanttensor.safe_open(paths, copy=False, buffer_size=largest + 1024) as f:
        kept = list(f.tensors())
        halves = [(name, t.view(-1)[: t.numel() // 2]) for name, t in kept]
        stats = f.stats()
        assert stats["materializations"] + stats["leased_views"] > 0
    for name, tensor in kept:
        assert same_bytes(tensor, tensors[name]), name
    for name, half in halves:
        expected = tensors[name].view(-1)[: tensors[name].numel() // 2]
        assert same_bytes(half, expected), name


def test_copy_true_tensors_own_their_bytes_and_outlive_the_context(model_files):
    paths, tensors = model_files
    with instanttensor.safe_open(paths) as f:
        kept = dict(f.tensors())
        assert f.copy is True
    for name, tensor in kept.items():
        assert tensor.untyped_storage().nbytes() == tensor.nbytes
        assert same_bytes(tensor, tensors[name])


def test_second_pass_and_random_access_mixed(model_files):
    paths, tensors = model_files
    with instanttensor.safe_open(paths, copy=False) as f:
        first = f.tensors()
        name, tensor = next(first)
        assert same_bytes(tensor, tensors[name])
        assert same_bytes(f.get_tensor("lm_head.weight"), tensors["lm_head.weight"])
        again = [(n, t.clone()) for n, t in f.tensors()]  # a new pass abandons the first
        assert [n for n, _ in again] == f.offset_keys()
        for n, t in again:
            assert same_bytes(t, tensors[n])


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_tensors_held_at_close_stay_in_place_and_the_rest_of_the_buffer_goes(tmp_path):
    # A loop variable outlives its loop: the last tensor is still held when the `with` block
    # closes. It keeps its bytes where they are (no copy); the rest of the buffer's memory is
    # given back at close, and the buffer goes with the last held tensor.
    from safetensors.torch import save_file

    torch.manual_seed(2)
    tensors = {f"w{i:02d}": torch.randn(1024, 1024) for i in range(12)}  # 4 MiB each
    path = str(tmp_path / "model.safetensors")
    save_file(tensors, path)
    with instanttensor.safe_open(path, copy=False, buffer_size=40 << 20, backend="pread") as f:
        for name, tensor in f.tensors():
            view = tensor[1:]  # a view shares the storage
        address = tensor.data_ptr()
        before = _resident_bytes()
    after = _resident_bytes()
    assert f.stats()["materializations"] == 0
    assert tensor.data_ptr() == address
    assert same_bytes(tensor, tensors[name]) and same_bytes(view, tensors[name][1:])
    assert before - after >= 24 << 20, (before, after)  # the 40 MiB buffer, less the held 4 MiB
    tensor.add_(1)  # still ordinary writable memory
    assert torch.equal(view, tensors[name][1:] + 1)
    del tensor, view  # the last reference: the buffer is freed (ASan runs would see a leak)
