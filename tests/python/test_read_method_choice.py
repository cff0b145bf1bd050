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
                   r"against (O_DIRECT|buffered) ([0-9.]+) GB/s over ([0-9]+) MiB each\)")
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
            read_by, chosen, chosen_rate, other, other_rate, probe_mib = timed.groups()
            assert probe_mib == "8", backend  # 1/64 of 272 MiB, at least 8 MiB
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


@pytest.fixture(scope="module")
def uneven_checkpoint(tmp_path_factory) -> tuple[str, dict[str, torch.Tensor]]:
    """Over 256 MiB, with tensors of odd sizes at offsets O_DIRECT cannot read straight into."""
    path = str(tmp_path_factory.mktemp("uneven") / "model.safetensors")
    tensors = {"big": torch.arange(66 << 20, dtype=torch.int32),
               "odd": torch.arange(1001, dtype=torch.uint8),
               "half": torch.linspace(-1, 1, 3333, dtype=torch.float16),
               "tail": torch.arange(3 << 20, dtype=torch.int64).flip(0)}
    reference_save(tensors, path)
    return path, tensors


@pytest.mark.parametrize("rates, method", [("3,1", "O_DIRECT"), ("1.1,1", "buffered")])
def test_the_method_the_rates_choose_reads_every_byte(uneven_checkpoint, monkeypatch, rates,
                                                      method):
    """The rates replaced (a testing build's switch), so O_DIRECT wins on a disk where buffered
    reads time faster: the alignments and the chunk are settled after the choice, and every way
    of reading (the staged pipeline owned and borrowed, random access, load_into) is right."""
    path, tensors = uneven_checkpoint
    monkeypatch.setenv("INSTANTTENSOR_TESTING_READ_RATES", rates)
    direct, buffered = (float(r) for r in rates.split(","))
    expected = f"auto: {method} {direct if method == 'O_DIRECT' else buffered:.2f} GB/s against "
    for copy in (True, False):
        cold([path])
        with instanttensor.safe_open(path, copy=copy, _force_staging=True) as f:
            backend = f.stats()["backend"]
            assert backend.startswith("pread+O_DIRECT (" if method == "O_DIRECT" else "pread ("), \
                backend
            assert expected in backend and "rates set by INSTANTTENSOR_TESTING_READ_RATES" in \
                backend, backend
            for name, t in f.tensors():
                assert torch.equal(t, tensors[name]), name
    cold([path])
    with instanttensor.safe_open(path, _force_staging=True) as f:
        assert method in f.stats()["backend"]
        assert torch.equal(f.get_tensor("odd"), tensors["odd"])
        assert torch.equal(f.get_slice("half")[5:3001], tensors["half"][5:3001])
        destination = {n: torch.empty_like(t) for n, t in tensors.items()}
        destination["odd"] = torch.empty(1002, dtype=torch.uint8)[1:]  # an odd address
        f.load_into(destination)
        assert all(torch.equal(destination[n], tensors[n]) for n in tensors)
