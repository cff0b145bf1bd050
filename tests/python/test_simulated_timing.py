"""The simulated device's timing model and counters (tests/simulated_device/sim_runtime.h), which
benchmarks/device_pipeline.py reads: what they count, that the copy engine is one per direction
shared by all streams of a device (a lower bound on time only: the model can make copies slower,
never faster), and that loads stay bit-exact with the model on."""

from __future__ import annotations

import gc
import os
import statistics
import time

import pytest
import torch
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import instanttensor
import simulated_device as simdev

pytestmark = pytest.mark.skipif(not simdev.load(), reason="needs the CMake build's simulated "
                                "device (INSTANTTENSOR_CMAKE_BUILD_DIR)")


@pytest.fixture
def timing():
    yield simdev.set_timing
    simdev.set_timing(0, 0, 0)
    simdev.set_move_bytes(True)


def test_a_blocking_read_back_is_a_host_sync_and_an_asynchronous_copy_is_not():
    gc.collect()  # an earlier test's loader closed by the collector would sync in between
    host = torch.arange(1 << 16, dtype=torch.uint8).pin_memory()
    device = torch.empty(1 << 16, dtype=torch.uint8, device="simdev")
    torch.ops.simdev.synchronize(0)
    before = simdev.counters()
    device.copy_(host, non_blocking=True)  # pinned source: queued, the host goes on
    queued = simdev.counters()
    assert queued["host_syncs"] == before["host_syncs"]
    assert torch.equal(device.cpu(), host)  # the read back waits for the copy
    after = simdev.counters()
    assert after["host_syncs"] == queued["host_syncs"] + 1
    # A sync on work already done is not a wait; on work still queued it is.
    torch.ops.simdev.synchronize(0)
    idle = simdev.counters()
    torch.ops.simdev.synchronize(0)  # every stream of the device, all idle
    again = simdev.counters()
    assert again["host_syncs"] > idle["host_syncs"]
    assert again["host_waits"] == idle["host_waits"]
    torch.ops.simdev.sleep(0, 20_000)  # 20 ms on the current stream
    torch.ops.simdev.synchronize(0)
    assert simdev.counters()["host_waits"] >= again["host_waits"] + 1


def test_peaks_follow_device_and_pinned_allocations():
    torch.ops.simdev.synchronize(0)  # frees still queued by earlier tests have run
    simdev.reset_peaks()
    start = simdev.device_bytes(0)
    pinned_start = simdev.pinned_bytes_peak()
    block = torch.empty(3 << 20, dtype=torch.uint8, device="simdev:0")
    staging = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
    assert simdev.device_bytes_peak(0) >= start + (3 << 20)
    assert simdev.pinned_bytes_peak() >= pinned_start + (1 << 20)
    del block, staging
    torch.ops.simdev.synchronize(0)
    # The peak stays above what is in use now until reset, then restarts there.
    assert simdev.device_bytes(0) == start
    assert simdev.device_bytes_peak(0) >= start + (3 << 20)
    simdev.reset_peaks()
    assert simdev.device_bytes_peak(0) == simdev.device_bytes(0)


def test_the_copy_engine_is_shared_by_the_streams_of_a_device(timing):
    # 2 copies of 2 MB at 0.1 GB/s on two streams: 20 ms each, one after the other on the one
    # engine, so at least 40 ms however the streams are scheduled.
    timing(0.1, 0.1, 0)
    host = torch.ones(2_000_000, dtype=torch.uint8).pin_memory()
    targets = [torch.empty(2_000_000, dtype=torch.uint8, device="simdev") for _ in range(2)]
    streams = [torch.Stream(device="simdev") for _ in range(2)]
    torch.ops.simdev.synchronize(0)
    start = time.perf_counter()
    for stream, target in zip(streams, targets):
        with stream:
            target.copy_(host, non_blocking=True)
    for stream in streams:
        stream.synchronize()
    assert time.perf_counter() - start >= 0.040
    assert all(torch.equal(t.cpu(), host) for t in targets)  # the bytes still move


def test_the_engine_keeps_the_device_clock_however_late_its_thread_runs(timing):
    # Copies queued back to back on one stream run back to back on the engine, even when the
    # worker thread that models them starts each one late (here: delays of 0-2 ms before every
    # operation; on a busy host, the scheduler's): a real copy engine does not wait for the
    # host's threads, so the benchmarks' engine must not either. Never faster than the model.
    timing(1.0, 1.0, 0)  # 1 MB copies: 1 ms each
    host = torch.ones(1_000_000, dtype=torch.uint8).pin_memory()
    targets = [torch.empty(1_000_000, dtype=torch.uint8, device="simdev") for _ in range(8)]
    torch.ops.simdev.synchronize(0)
    simdev.reset_engine_stats()
    simdev.set_delays(True)
    queued = []  # time.monotonic() once each copy_ returned: it was queued by then
    try:
        start = time.perf_counter()
        for target in targets:
            target.copy_(host, non_blocking=True)
            queued.append(time.monotonic())
        torch.ops.simdev.synchronize(0)
        elapsed = time.perf_counter() - start
    finally:
        simdev.set_delays(False)
    log = simdev.engine_log(0, True)
    assert len(log) == len(targets)
    # A copy this thread queued only after the one before it ended (the test's own thread
    # descheduled on a busy host) leaves the engine idle rightly: only the others count. The
    # median, since the worker's own bookkeeping between two copies can be preempted too; an
    # engine on the host's clock idles for each operation's delay (1 ms on average).
    idles = [following[0] - previous[1]
             for index, (previous, following) in enumerate(zip(log, log[1:]))
             if queued[index + 1] < previous[1]]
    assert idles, f"every copy was queued after the one before it ended: {queued}, {log}"
    assert statistics.median(idles) < 50e-6, f"the engine idled between queued copies: {idles}"
    assert elapsed >= 0.008


def test_a_wait_for_another_stream_goes_on_from_where_that_stream_got(timing):
    # A device-to-host copy on stream B after B waited for stream A's host-to-device copy (two
    # engines, so the engine's own turn cannot order them): it starts after A's copy ended on
    # the device's clock, however early B's worker ran the wait (delays on) or late A's did.
    timing(1.0, 1.0, 0)
    simdev.set_move_bytes(False)
    host = torch.ones(4_000_000, dtype=torch.uint8).pin_memory()
    device = torch.empty(4_000_000, dtype=torch.uint8, device="simdev")
    back = torch.empty(4_000_000, dtype=torch.uint8).pin_memory()
    first, second = torch.Stream(device="simdev"), torch.Stream(device="simdev")
    torch.ops.simdev.synchronize(0)
    simdev.set_delays(True)
    try:
        for _ in range(5):
            simdev.reset_engine_stats()
            with first:
                device.copy_(host, non_blocking=True)
                uploaded = torch.Event(device="simdev")
                uploaded.record(first)
            with second:
                second.wait_event(uploaded)
                back.copy_(device, non_blocking=True)
            torch.ops.simdev.synchronize(0)
            (up_start, up_end, _), = simdev.engine_log(0, True)
            (down_start, down_end, _), = simdev.engine_log(0, False)
            assert down_start >= up_end, (up_start, up_end, down_start)
    finally:
        simdev.set_delays(False)


def _stream_workers_cpu_ns() -> int | None:
    """CPU time of the simulator's stream worker threads (named simdev-stream), from /proc;
    None where /proc shows none (no per-thread schedstat)."""
    total, found = 0, False
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() != "simdev-stream":
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
                found = True
        except FileNotFoundError:  # a thread that ended meanwhile, or no schedstat
            pass
    return total if found else None


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
def test_the_simulators_cpu_counts_its_threads_whole_time():
    # 1000 operations of no work, each waking the stream's worker: what the worker spends is
    # waking, queue handling and telling the host, all of it the simulator's cost to the host
    # (benchmarks/device_pipeline.py's bound counts it). Counting only the operations found a
    # fraction of it (6% here).
    gc.collect()  # an earlier test's loader closed by the collector would run in between
    torch.ops.simdev.synchronize(0)
    threads_before = _stream_workers_cpu_ns()
    if threads_before is None:
        pytest.skip("/proc has no per-thread CPU time here")
    counted_before = simdev.counters()["worker_cpu_seconds"]
    for _ in range(1000):
        torch.ops.simdev.sleep(0, 0)
        torch.ops.simdev.synchronize(0)
    torch.ops.simdev.sleep(0, 0)  # the last one's wake-up is counted with this operation
    torch.ops.simdev.synchronize(0)
    counted = (simdev.counters()["worker_cpu_seconds"] - counted_before) * 1e9
    spent = _stream_workers_cpu_ns() - threads_before
    assert spent > 0
    assert 0.8 * spent <= counted <= 1.05 * spent + 1e6, (counted, spent)


def test_the_simulators_cpu_counts_the_host_threads_waking_its_workers():
    # Each operation enqueued while the stream's worker waits wakes it, on the enqueuing
    # thread's CPU (a futex wake): also the simulator's cost to the host, which a GPU's copy
    # engine does not have. It is counted apart from the workers' own CPU, never beyond what the
    # enqueuing thread spent, and it is the wake that is counted: enqueues while the worker is
    # busy (running a 0.5 s operation queued first, so no enqueue wakes it) cost a fraction.
    gc.collect()  # an earlier test's loader closed by the collector would enqueue in between
    torch.ops.simdev.synchronize(0)

    def woken(operations, worker_waits: bool) -> tuple[float, float]:
        before, thread_before = simdev.counters()["wake_cpu_seconds"], time.thread_time()
        for _ in range(operations):
            torch.ops.simdev.sleep(0, 0)
            if worker_waits:
                torch.ops.simdev.synchronize(0)  # the worker waits again before the next one
        return (simdev.counters()["wake_cpu_seconds"] - before,
                time.thread_time() - thread_before)

    idle, spent = woken(1000, worker_waits=True)
    assert 0 < idle <= spent, (idle, spent)
    torch.ops.simdev.sleep(0, 500_000)
    busy, _ = woken(1000, worker_waits=False)  # ~1-3 ms of enqueues, inside the 0.5 s
    torch.ops.simdev.synchronize(0)
    assert busy * 2 < idle, (busy, idle)


def test_without_moving_bytes_copies_only_take_their_time_but_small_ones_move(timing):
    # Above 64 KiB a copy only takes its time; control messages (a status word) still arrive.
    timing(1.0, 1.0, 0)
    large, small = torch.ones(1 << 20, dtype=torch.uint8), torch.ones(64, dtype=torch.uint8)
    on_device = [torch.zeros_like(t, device="simdev") for t in (large, small)]
    torch.ops.simdev.synchronize(0)
    simdev.set_move_bytes(False)
    for host, device in zip((large, small), on_device):
        device.copy_(host)
    small_back = on_device[1].cpu()
    simdev.set_move_bytes(True)
    assert torch.equal(on_device[0].cpu(), torch.zeros_like(large))
    assert torch.equal(small_back, small)


@pytest.mark.parametrize("mode", ["copy", "borrow", "into"])
def test_loads_are_bit_exact_with_the_timing_model_on(tmp_path, timing, mode):
    timing(0.5, 0.5, 50)
    torch.manual_seed(5)
    tensors = {f"w{i}": torch.randn(300 + i, 128) for i in range(6)}
    tensors["half"] = torch.randn(1000, 33).to(torch.bfloat16)
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    expected = reference_load(path)
    options = {"copy": mode != "borrow", "staging_size": 64 << 10, "chunk_size": 16 << 10}
    with instanttensor.safe_open([path], device="simdev:0", **options) as f:
        if mode == "into":
            got = {n: torch.empty_like(t, device="simdev:0") for n, t in expected.items()}
            f.load_into(got)
            got = {n: t.cpu() for n, t in got.items()}
        else:
            got = {n: t.cpu() for n, t in f.tensors()}
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
