"""`auto` on files out of the page cache: O_DIRECT and buffered reads are timed on the first
bytes of the load, the faster one reads, and stats()["backend"] says both rates and why."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
from instanttensor._demo_bench import evict, warm_up

TIMED = re.compile(r"^(pread\+O_DIRECT|pread) \(auto: (buffered|O_DIRECT) ([0-9.]+) GB/s "
                   r"against (O_DIRECT|buffered) ([0-9.]+) GB/s over 32 MiB each\)")
DIRECT_REFUSED = "O_DIRECT could not be timed"


def cold(paths: list[str]) -> None:
    if evict(paths) > 0.05:  # tmpfs keeps its pages
        pytest.skip("the page cache of the test folder cannot be dropped")


@pytest.fixture(scope="module")
def large_checkpoint(tmp_path_factory) -> tuple[str, dict[str, torch.Tensor]]:
    """272 MiB in one file: over the 256 MiB under which nothing is timed."""
    path = str(tmp_path_factory.mktemp("large") / "model.safetensors")
    tensors = {"a": torch.arange(64 << 20, dtype=torch.int32),
               "b": torch.arange(4 << 20, dtype=torch.int32).flip(0)}
    reference_save(tensors, path)
    return path, tensors


def test_a_cold_pipeline_reads_with_the_method_timed_faster(large_checkpoint):
    """The staged pipeline (what an accelerator target runs; forced here on the host)."""
    path, tensors = large_checkpoint
    cold([path])
    with instanttensor.safe_open(path, _force_staging=True) as f:
        backend = f.stats()["backend"]
        timed = TIMED.match(backend)
        if timed is None:
            assert DIRECT_REFUSED in backend, backend
            assert backend.startswith("pread (auto: buffered "), backend
        else:
            read_by, chosen, chosen_rate, other, other_rate = timed.groups()
            assert {chosen, other} == {"buffered", "O_DIRECT"}
            # O_DIRECT is kept only when a quarter faster: buffered reads share the page cache.
            if chosen == "O_DIRECT":
                assert float(chosen_rate) >= 1.25 * float(other_rate) - 0.02, backend
            else:
                assert 1.25 * float(chosen_rate) > float(other_rate) - 0.02, backend
            assert read_by == ("pread+O_DIRECT" if chosen == "O_DIRECT" else "pread"), backend
        # Every byte comes through whichever method won: the pass and random access alike.
        assert all(torch.equal(t, tensors[n]) for n, t in f.tensors())
        assert torch.equal(f.get_tensor("b"), tensors["b"])


def test_a_cold_host_iteration_times_nothing(large_checkpoint):
    """Host views read through the page cache: random access and load_into read buffered."""
    path, tensors = large_checkpoint
    cold([path])
    with instanttensor.safe_open(path) as f:
        backend = f.stats()["backend"]
        assert backend.startswith(
            "pread (auto: buffered, the iteration reads through the page cache)"), backend
        destination = {n: torch.empty_like(t) for n, t in tensors.items()}
        f.load_into(destination)
        assert all(torch.equal(destination[n], tensors[n]) for n in tensors)


def test_a_small_cold_checkpoint_is_read_buffered_without_timing(tmp_path):
    path = str(tmp_path / "small.safetensors")
    tensors = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    reference_save(tensors, path)
    cold([path])
    with instanttensor.safe_open(path, _force_staging=True) as f:
        backend = f.stats()["backend"]
        assert backend.startswith("pread (auto: buffered, not timed (under 256 MiB))"), backend
        assert torch.equal(dict(f.tensors())["w"], tensors["w"])


def test_a_cached_checkpoint_times_nothing(large_checkpoint):
    path, tensors = large_checkpoint
    warm_up([path])
    with instanttensor.safe_open(path, _force_staging=True) as f:
        assert f.stats()["backend"] == "pread"
        assert torch.equal(f.get_tensor("b"), tensors["b"])


def test_a_named_method_is_never_timed(large_checkpoint):
    path, _ = large_checkpoint
    cold([path])
    with instanttensor.safe_open(path, backend="pread", _force_staging=True) as f:
        assert f.stats()["backend"] == "pread"
