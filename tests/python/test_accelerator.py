"""The device path on an accelerator: CUDA where a GPU is present, else the simulated device
(tests/simulated_device, torch's PrivateUse1 backend as "simdev"), whose copies run later on
stream worker threads after random 0-2 ms delays (INSTANTTENSOR_SIMDEV_DELAY=1 in CI), so a
fence in the wrong place shows as wrong bytes. scripts/check_fences.sh drops each fence in turn
and expects this file to fail."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
import simulated_device
from conftest import same_bytes
from test_distributed import fault_library  # reads the build folder at import, before fixtures

KIND = simulated_device.accelerator()
pytestmark = pytest.mark.skipif(KIND is None, reason="no GPU, and the simulated device was not "
                                "built (INSTANTTENSOR_CMAKE_BUILD_DIR)")


class Device:
    """What the tests need of an accelerator, on CUDA and on the simulated device alike."""

    def __init__(self, kind: str):
        self.kind = kind
        self.module = getattr(torch, kind)

    def current(self) -> torch.device:
        return torch.device(self.kind, self.module.current_device())

    def stream(self, index: int | None = None) -> torch.Stream:
        return torch.Stream(device=self.current() if index is None else
                            torch.device(self.kind, index))

    def slow(self, micros: int = 20_000) -> None:
        """A slow kernel queued on the current stream."""
        if self.kind == "cuda":
            torch.cuda._sleep(int(micros * 1000))
        else:
            torch.ops.simdev.sleep(self.module.current_device(), micros)

    def synchronize(self) -> None:
        for index in range(self.module.device_count()):
            self.module.synchronize(index)

    def allocated(self, index: int = 0) -> int:
        gc.collect()  # tensors of earlier tests still in reference cycles
        self.synchronize()
        if self.kind == "cuda":
            return torch.cuda.memory_allocated(index)
        return simulated_device.device_bytes(index)

    def pinned(self) -> int:
        if self.kind == "cuda":
            return torch.cuda.host_memory_stats()["allocated_bytes.current"]
        return simulated_device.pinned_bytes()


@pytest.fixture
def accel():
    device = Device(KIND)
    stale_before = simulated_device.stale_accesses() if KIND == "simdev" else 0
    yield device
    if KIND == "simdev":
        gc.collect()  # tensors in a failure's traceback cycles: freed now, not in the next test
        device.synchronize()
        assert simulated_device.stale_accesses() == stale_before, \
            "a queued copy touched device memory that was already freed"


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(17)
    tensors = {f"layers.{i}.weight": torch.randn(64 + i, 96) for i in range(16)}
    tensors["embed"] = torch.randn(300, 64).to(torch.bfloat16)
    tensors["tiny"] = torch.tensor([1, 2, 3], dtype=torch.int8)
    tensors["empty"] = torch.empty(0, 4)
    tensors["scalar"] = torch.tensor(5, dtype=torch.int64)
    names = sorted(tensors)
    paths = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    reference_save({n: tensors[n] for n in names[::2]}, paths[0])
    reference_save({n: tensors[n] for n in names[1::2]}, paths[1])
    return paths, tensors


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


@pytest.mark.parametrize("copy", [True, False])
def test_every_tensor_arrives_through_a_wrapping_staging_ring_with_slow_copies(accel, checkpoint,
                                                                               copy):
    paths, tensors = checkpoint
    staging = 32 << 10  # the smallest ring: every large tensor streams through it in slices
    assert sum(t.nbytes for t in tensors.values()) > 8 * staging
    options = {} if copy else {"buffer_size": 128 << 10}
    with instanttensor.safe_open(paths, device=accel.kind, copy=copy, staging_size=staging,
                                 **options) as f:
        for name, tensor in f.tensors():
            assert tensor.device == accel.current(), name
            assert same_bytes(on_host(tensor), tensors[name]), name


@pytest.mark.skipif(KIND != "simdev", reason="holds one read, slows the copies: simulated device "
                    "only")
@pytest.mark.parametrize("copy", [True, False])
def test_a_tensor_whose_slices_were_copied_out_of_order_arrives_whole(accel, tmp_path, copy):
    # One 10 MiB tensor read in 1 MiB slices by 2 workers (over 8 MiB: not read inline); the
    # second read call is held while the slices behind it are read and copied ahead of it
    # (copy_ready). The held one is copied last: the tensor handed out must wait for that copy
    # too, not only for its own last slice's.
    torch.ops.load_library(fault_library())
    testing = torch.ops.instanttensor_testing
    torch.manual_seed(3)
    weight = torch.randn((10 << 20) // 4)
    path = str(tmp_path / "one.safetensors")
    reference_save({"w": weight}, path)
    simulated_device.set_timing(0.05, 0.05, 10)  # a 1 MiB copy holds the engine 21 ms
    simulated_device.reset_engine_stats()
    delays = torch.ops.simdev.delays()
    simulated_device.set_delays(False)  # the order below is the test's own
    got, failures = {}, []

    def load():
        try:
            with instanttensor.safe_open(path, device="simdev:0", copy=copy, backend="pread",
                                         concurrency=2, chunk_size=1 << 20,
                                         staging_size=16 << 20) as f:
                for name, tensor in f.tensors():
                    got[name] = on_host(tensor)
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    testing.hold_read(2)  # the second read call: the first or second slice
    thread = threading.Thread(target=load)
    thread.start()
    try:
        testing.wait_for_held_read()
        # The consumer books the reads behind the held one while it waits for it, and queues
        # their copies: all nine others run on the engine ahead of it.
        deadline = time.monotonic() + 60
        while simulated_device.engine_stats(0, True)["copies"] < 9:
            assert time.monotonic() < deadline, "the slices behind the held read were not copied"
            os.sched_yield()
        # The held slice's copy, queued once its read is let go, runs at least 30 ms late on the
        # stalled loader's stream; the consumer's stream stays idle and reads at once unless the
        # tensor's fence covers that copy.
        torch.ops.simdev.stall_pool_streams(accel.module.current_device(), 30_000)
    finally:
        testing.release_held_reads()
        thread.join()
        testing.disarm_faults()
        simulated_device.set_timing(0, 0, 0)
        simulated_device.set_delays(delays)
    assert not failures, failures
    assert same_bytes(got["w"], weight)


@pytest.mark.parametrize("index", [0, 1])
def test_an_unindexed_device_is_the_current_one_and_an_index_is_kept(accel, checkpoint, index):
    if accel.module.device_count() <= index:
        pytest.skip("one device only")
    paths, tensors = checkpoint
    previous = accel.module.current_device()
    accel.module.set_device(index)
    try:
        with instanttensor.safe_open(paths, device=accel.kind, keys=["embed"]) as f:
            assert f.get_tensor("embed").device == torch.device(accel.kind, index)
    finally:
        accel.module.set_device(previous)
    other = 1 - index if accel.module.device_count() > 1 else index
    with instanttensor.safe_open(paths, device=f"{accel.kind}:{other}") as f:
        for name, tensor in f.tensors():
            assert tensor.device == torch.device(accel.kind, other)
            assert same_bytes(on_host(tensor), tensors[name]), name


def test_a_consumer_still_reading_a_borrowed_region_on_a_side_stream(accel, checkpoint):
    """The consumer queues slow work on its own stream that reads each borrowed tensor; the
    loader advances at once. A region may only be reused after the consumer's stream passed it:
    every copy the consumer made must hold the tensor's bytes."""
    paths, tensors = checkpoint
    side = accel.stream()
    copies = {}
    with side:
        with instanttensor.safe_open(paths, device=accel.kind, copy=False,
                                     buffer_size=64 << 10, staging_size=32 << 10) as f:
            for name, tensor in f.tensors():
                accel.slow(10_000)
                copies[name] = torch.empty_like(tensor)
                copies[name].copy_(tensor)  # queued after the slow kernel, reads the region
                # Nothing holds the tensor when the loader advances, so only the region's release
                # point (not the copy-out of a kept tensor) can order its reuse after the copy.
                del tensor
    side.synchronize()
    for name, value in copies.items():
        assert same_bytes(on_host(value), tensors[name]), name


def test_borrowed_tensors_kept_past_their_step_and_at_close_never_change(accel, checkpoint):
    paths, tensors = checkpoint
    snapshots = []
    with instanttensor.safe_open(paths, device=accel.kind, copy=False, buffer_size=64 << 10,
                                 staging_size=32 << 10) as f:
        kept = []
        for item in f.tensors():  # the ring wraps under every kept tensor
            kept.append(item)
            # Read every kept tensor at once on the consumer's stream: one just copied out of
            # the ring (inside that step) must be read after its copy, not before.
            snapshots.extend((name, torch.empty_like(t).copy_(t)) for name, t in kept)
        assert f.stats()["materializations"] > 0
        del item
    # Closed: the last tensors were still held; they were copied out, not freed.
    gc.collect()
    for name, tensor in kept + snapshots:
        assert same_bytes(on_host(tensor), tensors[name]), name


@pytest.mark.skipif(KIND != "simdev", reason="stalls the loader's streams: simulated device only")
def test_a_kept_tensor_copied_out_of_the_ring_is_read_after_its_copy(accel, checkpoint):
    """The copy-out of a kept borrowed tensor runs on the loader's stream, here stalled; a read
    the consumer queues right after it (on its idle stream) must wait for that copy. During the
    pass the copy of the step's own group often orders it too; at close nothing else does."""
    paths, tensors = checkpoint
    device = accel.module.current_device()
    reads = []
    with instanttensor.safe_open(paths, device=accel.kind, copy=False, buffer_size=64 << 10,
                                 staging_size=32 << 10) as f:
        kept, copied_out = [], 0
        iteration = f.tensors()
        while True:
            accel.synchronize()
            torch.ops.simdev.stall_pool_streams(device, 30_000)
            item = next(iteration, None)
            if item is None:
                break
            kept.append(item)
            if f.stats()["materializations"] > copied_out:  # copied out inside this step
                copied_out = f.stats()["materializations"]
                reads.extend((n, torch.empty_like(t).copy_(t)) for n, t in kept)
        assert copied_out > 0
        del item
        accel.synchronize()
        torch.ops.simdev.stall_pool_streams(device, 30_000)
    # Closed with the loader's stream stalled: the kept tensors still in the ring were copied
    # out on it; reads queued now on the idle consumer's stream must come after those copies.
    reads.extend((n, torch.empty_like(t).copy_(t)) for n, t in kept)
    accel.synchronize()
    for name, tensor in reads:
        assert same_bytes(on_host(tensor), tensors[name]), name


def test_device_and_pinned_memory_return_after_close(accel, checkpoint):
    paths, _ = checkpoint
    before = accel.allocated(0)
    for copy in (True, False):
        with instanttensor.safe_open(paths, device=f"{accel.kind}:0", copy=copy,
                                     staging_size=32 << 10) as f:
            for name, tensor in f.tensors():
                pass
        del tensor
    gc.collect()
    assert accel.allocated(0) == before
    assert accel.pinned() == 0


@pytest.mark.parametrize("slow_copies", [False, True])
def test_a_read_failure_while_copies_are_in_flight_frees_nothing_early(accel, checkpoint,
                                                                       slow_copies):
    # slow_copies: the simulated copy engine at 10 MB/s, so copies into owned tensors read ahead
    # are still queued on the loader's stream when the read fails; their memory may go back to
    # the allocator only after them (on CUDA: reused by the next allocation while a copy still
    # writes into it). The fixture fails the test if a copy found its memory freed (owned_free).
    if slow_copies and KIND != "simdev":
        pytest.skip("slows the simulated device's copy engine")
    torch.ops.load_library(fault_library())
    paths, tensors = checkpoint
    before = accel.allocated(0)

    def load_until_the_failure(copy):
        received = {}
        with pytest.raises(OSError, match="Input/output error"):
            with instanttensor.safe_open(paths, device=f"{accel.kind}:0", copy=copy,
                                         staging_size=32 << 10, chunk_size=4096,
                                         concurrency=2) as f:
                if slow_copies:
                    torch.ops.instanttensor_testing.arm_read_fault(6, 5)  # EIO on the 6th read call
                else:
                    # Reads at 5 ms each cannot finish the pass (~120 reads) before the consumer
                    # holds its first tensor, and the next read after that fails: the failure
                    # comes mid-pass after a tensor, whatever the scheduling (a fixed read number
                    # could race the first tensor's delivery).
                    torch.ops.instanttensor_testing.arm_read_delay(5)
                for name, tensor in f.tensors():
                    if not received and not slow_copies:
                        torch.ops.instanttensor_testing.arm_read_fault(1, 5)
                    received[name] = tensor.clone()
                    del tensor  # the traceback of the failure would keep it
        return received

    if slow_copies:
        simulated_device.set_timing(0.01, 0.01, 500)
    # Whether a copy is still queued when the failure frees the memory is up to the scheduling
    # (scripts/check_fences.sh: a dropped owned_free fence went unnoticed in about 1 of 5 slow
    # runs): five rounds make a dropped fence's escape a matter of one run in thousands.
    rounds = 5 if slow_copies else 1
    try:
        for copy in (True, False) * rounds:
            received = load_until_the_failure(copy)
            torch.ops.instanttensor_testing.arm_read_fault(-1, 0)
            # Fast copies: a tensor arrived by construction (the fault is armed once one is held).
            # Slow copies let the reads run far ahead: the failure may come before any tensor.
            assert all(same_bytes(on_host(received[n]), tensors[n]) for n in received), \
                "what arrived before the failure is wrong"
            del received
    finally:
        torch.ops.instanttensor_testing.arm_read_fault(-1, 0)
        if slow_copies:
            simulated_device.set_timing(0, 0, 0)
    gc.collect()
    assert accel.pinned() == 0
    assert accel.allocated(0) == before


def test_load_into_device_parameters_with_slow_copies(accel, checkpoint):
    paths, tensors = checkpoint
    device = accel.current()
    destinations = {n: torch.zeros(t.shape, dtype=t.dtype, device=device)
                    for n, t in tensors.items()}
    pointers = {n: t.data_ptr() for n, t in destinations.items()}
    accel.synchronize()  # the zeros were queued on the default stream, not the consumer's
    side = accel.stream()
    with side:
        # Queued on the consumer's stream before the load, behind a slow kernel: must read the
        # old (zero) values, however long the kernel takes.
        accel.slow(300_000)
        old = {n: torch.empty_like(t).copy_(t) for n, t in destinations.items()}
        instanttensor.load_into(destinations, paths, staging_size=32 << 10)
        # After load_into, on the same stream: the new values.
        new = {n: torch.empty_like(t).copy_(t) for n, t in destinations.items()}
    side.synchronize()
    for name in tensors:
        assert same_bytes(on_host(old[name]), torch.zeros_like(tensors[name])), name
        assert same_bytes(on_host(new[name]), tensors[name]), name
    for name, tensor in destinations.items():
        assert tensor.data_ptr() == pointers[name], name
        assert same_bytes(on_host(tensor), tensors[name]), name
    assert accel.pinned() == 0


@pytest.mark.parametrize("limit", [0, 16 << 10])
def test_a_refused_pinning_stages_through_pageable_memory(accel, checkpoint, limit):
    # A locked-memory limit (none at all, or below the ring): every API still delivers every
    # byte, staging through pageable memory; stats() says so; nothing stays pinned.
    if KIND != "simdev":
        pytest.skip("the simulated device's locked-memory limit")
    paths, tensors = checkpoint
    before = accel.allocated(0)
    simulated_device.set_pinned_limit(limit)
    try:
        for copy in (True, False):
            with instanttensor.safe_open(paths, device=f"{accel.kind}:0", copy=copy,
                                         staging_size=64 << 10) as f:
                for name, tensor in f.tensors():
                    assert same_bytes(on_host(tensor), tensors[name]), name
                del tensor
                assert f.stats()["staging"].startswith("pageable (pinning refused: simdev: "
                                                       "pinning"), f.stats()["staging"]
                assert f.stats()["staging_bytes"] == 64 << 10  # the loader's memory, stated
                assert (f.stats()["device_ring_bytes"] > 0) == (not copy)
        destinations = {n: torch.zeros(t.shape, dtype=t.dtype, device=accel.current())
                        for n, t in tensors.items()}
        with instanttensor.safe_open(paths, staging_size=64 << 10) as f:
            f.load_into(destinations)
            assert f.stats()["staging"].startswith("pageable"), f.stats()["staging"]
        for name, destination in destinations.items():
            assert same_bytes(on_host(destination), tensors[name]), name
        assert accel.pinned() == 0
    finally:
        simulated_device.set_pinned_limit(-1)
    del destinations, destination
    gc.collect()
    assert accel.allocated(0) == before
    with instanttensor.safe_open(paths, device=f"{accel.kind}:0", staging_size=64 << 10) as f:
        dict(f.tensors())
        assert f.stats()["staging"] == "pinned"
    assert f.stats()["staging"] == "pinned"  # the final counts, after close


def test_a_pinning_limit_below_the_ring_stages_through_a_smaller_pinned_ring(accel, checkpoint):
    # Pinning the 1 MiB ring asked is refused, 256 KiB is granted: the staging stays pinned
    # (copies stay asynchronous) with the slices planned (64 KiB, two fit), for every API.
    if KIND != "simdev":
        pytest.skip("the simulated device's locked-memory limit")
    paths, tensors = checkpoint
    smaller = "pinned, smaller (262144 of 1048576 bytes; pinning 1048576 refused: simdev: pinning"
    options = {"staging_size": 1 << 20, "chunk_size": 64 << 10}
    simulated_device.set_pinned_limit(300 << 10)
    try:
        for copy in (True, False):
            with instanttensor.safe_open(paths, device=f"{accel.kind}:0", copy=copy,
                                         **options) as f:
                for name, tensor in f.tensors():
                    assert same_bytes(on_host(tensor), tensors[name]), name
                del tensor
                assert f.stats()["staging"].startswith(smaller), f.stats()["staging"]
                assert f.stats()["staging_bytes"] == 256 << 10
        destinations = {n: torch.zeros(t.shape, dtype=t.dtype, device=accel.current())
                        for n, t in tensors.items()}
        with instanttensor.safe_open(paths, **options) as f:
            f.load_into(destinations)
            assert f.stats()["staging"].startswith(smaller), f.stats()["staging"]
        for name, destination in destinations.items():
            assert same_bytes(on_host(destination), tensors[name]), name
        assert accel.pinned() == 0
    finally:
        simulated_device.set_pinned_limit(-1)


@pytest.mark.parametrize("cache_bytes, chunk_size, slice_bytes", [
    (24 << 20, None, 2 << 20),  # 6 slots (2 reads, one queued each, 2 under copy) in 12 MiB
    (56 << 20, None, 4 << 20),  # 6 x (4 MiB and its O_DIRECT widening) in 28 MiB
    (4 << 20, None, 2 << 20),  # 2 MiB at least
    (0, None, 8 << 20),  # no cache size known: the default chunk
    (24 << 20, 4 << 20, 4 << 20),  # a chunk_size asked is kept
])
def test_warm_staged_reads_take_slices_that_fit_half_the_last_level_cache(
        accel, tmp_path, monkeypatch, cache_bytes, chunk_size, slice_bytes):
    # Warm reads are copies by the CPU into the staging ring: a ring in use within half the
    # last-level cache is written there, not through to memory (plan::choose_staged_read_bytes).
    torch.manual_seed(3)
    tensors = {"big": torch.randn(4 << 20), "small": torch.randn(7)}  # 16 MiB and 28 bytes
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    with open(path, "rb") as file:
        file.read()  # every page in the cache
    monkeypatch.setenv("INSTANTTENSOR_TESTING_LLC_BYTES", str(cache_bytes))
    # What else decides the size: the read method (a pread pool of 2 workers here), a chunk
    # size, other processes a launcher started beside this one.
    for name in ("INSTANTTENSOR_BACKEND", "INSTANTTENSOR_CHUNK_SIZE", "LOCAL_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    options = {} if chunk_size is None else {"chunk_size": chunk_size}
    for copy in (True, False):
        with instanttensor.safe_open(path, device=accel.kind, copy=copy, concurrency=2,
                                     **options) as f:
            for name, tensor in f.tensors():
                assert same_bytes(on_host(tensor), tensors[name]), name
            del tensor
            # The big tensor in whole slices (its start and end widened to the alignment may
            # take one more), the small one in one read.
            assert f.stats()["read_bytes"] == slice_bytes, copy
            reads = f.stats()["read_requests"]
            assert (16 << 20) // slice_bytes + 1 <= reads <= (16 << 20) // slice_bytes + 2, \
                (copy, reads)


REFUSED_PINNING_CHILD = """
import sys, warnings, torch
sys.path.insert(0, sys.argv[1])
import instanttensor, simulated_device
simulated_device.load()
simulated_device.set_pinned_limit(0)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        with instanttensor.safe_open(sys.argv[2:], device="simdev:0") as f:
            dict(f.tensors())
print(sum("pinning" in str(w.message) for w in caught))
"""


def test_a_refused_pinning_warns_once_per_process(accel, checkpoint):
    if KIND != "simdev":
        pytest.skip("the simulated device's locked-memory limit")
    paths, _ = checkpoint
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, INSTANTTENSOR_CMAKE_BUILD_DIR=simulated_device.build_dir())
    child = subprocess.run([sys.executable, "-c", REFUSED_PINNING_CHILD, here, *paths],
                           capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split()[-1] == "1", child.stdout + child.stderr


def test_the_budget_comes_from_the_devices_free_memory(accel, checkpoint):
    paths, tensors = checkpoint
    with pytest.raises(ValueError, match="budget"):
        instanttensor.safe_open(paths, device=accel.kind, max_free_mem_usage=1e-12)
    with instanttensor.safe_open(paths, device=accel.kind, max_free_mem_usage=1e-12,
                                 host_fallback=True) as f:
        for name, tensor in f.tensors():
            assert same_bytes(on_host(tensor), tensors[name]), name


def test_the_engine_computes_the_default_budget_for_every_api(accel, checkpoint, monkeypatch):
    # The class the Python layer opens through, without any budget given: the engine takes
    # INSTANTTENSOR_MAX_FREE_MEM_USAGE of the free memory the device's allocator reports (as a
    # C++ caller's SafeOpen does), and a share that leaves no room refuses the tensors.
    paths, tensors = checkpoint
    device = torch.device(accel.kind, 0)
    monkeypatch.setenv("INSTANTTENSOR_MAX_FREE_MEM_USAGE", "1e-12")
    with pytest.raises(RuntimeError, match="budget"):
        torch.classes.instanttensor.Loader(paths, device)
    monkeypatch.delenv("INSTANTTENSOR_MAX_FREE_MEM_USAGE")
    loader = torch.classes.instanttensor.Loader(paths, device, max_free_mem_usage=1e-12,
                                                host_fallback=True)
    while (item := loader.next()) is not None:
        name, tensor = item
        # Over the budget: kept on the host (an empty tensor fits any budget).
        assert tensor.device.type == "cpu" or tensor.numel() == 0, name
        assert same_bytes(on_host(tensor), tensors[name]), name
    loader.close()
    loader = torch.classes.instanttensor.Loader(paths, device)  # half the free memory: room
    while (item := loader.next()) is not None:
        assert item[1].device == device, item[0]
    loader.close()


def test_the_vllm_iterator_borrowed_onto_the_device(accel, checkpoint, monkeypatch):
    from instanttensor.integrations.vllm import BORROWED_MARKER

    paths, tensors = checkpoint
    monkeypatch.setenv("INSTANTTENSOR_COPY", "0")
    monkeypatch.setenv("INSTANTTENSOR_BUFFER_SIZE", "64K")
    params = {n: torch.empty(t.shape, dtype=t.dtype, device=accel.current())
              for n, t in tensors.items()}
    with instanttensor.safe_open(paths, device=accel.kind, copy=False) as f:
        for name, tensor in f.tensors():
            setattr(tensor, BORROWED_MARKER, True)
            params[name].copy_(tensor)  # a weight loader consumes it on the current stream
        del tensor
    for name, param in params.items():
        assert same_bytes(on_host(param), tensors[name]), name
