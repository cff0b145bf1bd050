"""The device pipeline's speed, host waits and memory: copy=True, copy=False and load_into onto an
accelerator, against the bound of its slower stage.

    python benchmarks/device_pipeline.py [--size-gb 1] [--samples 3] [--json FILE] [--plot FILE]
        [--timeline PNG]   (one more pass per cell, its stages in time: pipeline_timeline.py)

On a machine without a GPU the target is the simulated device (tests/simulated_device; needs the
CMake build: INSTANTTENSOR_CMAKE_BUILD_DIR, default ./build) with its timing model on: one copy
engine per direction, each copy holding it for `latency + bytes / bandwidth`. Two settings:
  copy-bound  host->device at --copy-bound-gbps (below the read rate: the copy engine limits)
  read-bound  host->device at --read-bound-gbps (above it: the reads limit)
With `--device cuda` the same modes run on the GPU with its real copy engine (no model, no
counters; the bound is then the slower of the read rate and a pinned host->device copy).

Every sample is a fresh process; the contenders run interleaved, their order rotating each round;
cold samples evict the checkpoint from the page cache first (posix_fadvise DONTNEED, checked with
mincore); figures are medians. Per mode and setting:
  GB/s            checkpoint bytes / (open .. last byte on the device, after a synchronize)
  ratio_to_bound  GB/s / min(read rate, copy bandwidth, host CPU bound); the read rate is
                  measured alone in the same run: buffered reads by 2 threads into a staging
                  ring of its own, no copies (cold: the fastest of that, buffered reads by as
                  many threads as the loader reads with, 4, and O_DIRECT reads by 4, each from
                  an evicted page cache: a ceiling is the best read by any method). The ring
                  read into is allocated inside the read's timing, as the loader's is (a load
                  in a fresh process faults fresh staging memory: a GPU pins it, the simulated
                  device's pinned memory is faulted as it is first written), as large as what
                  the loader's staging uses by default, in reads of the loader's size (warm,
                  2 cores, 32 MiB L3: 12 MiB in 2 MiB reads, stats()["read_bytes"]; cold: 64
                  MiB in 8 MiB reads); warm, the faster of that ring in 2 MiB pages (as the
                  loader advises its staging) and in 4 KiB pages. The host CPU bound: the checkpoint's bytes
                  over the CPU seconds any pipeline spends on this host's cores (the read
                  alone's, and the simulator's stream threads' whole time: copies, waking,
                  queue handling; and the host threads' wakes of those threads; each measured)
                  spread over all of them. Beside it (warm),
                  the read alone into a ring touched before its timing, as this script
                  measured it until 2026-12-07
  host waits      host threads blocking on the device (stream/event synchronize, blocking
                  copies) inside the pass (the first tensor asked .. the last received; for
                  load_into: the call), and after it (the end of the iteration and the close)
  loader device peak  device bytes the loader held beyond what it had handed out (copy=True:
                  tensors handed out are the consumer's), at the worst moment of the pass
  pinned peak     pinned host bytes the loader held
  threads         where the pass's CPU went (a second table), from the open to the last tensor
                  (before the close): CPU and waits for a core of the loader's threads (it-*,
                  beside the read alone's CPU), the consumer's thread (which also runs this
                  script's probe and the wakes of the simulator's workers) and the simulator's
                  threads, and the share of the cores no thread used
A 2-rank row (simulated device, copy=True, warm): each rank on its own device in a device group
("cpu:gloo,simdev:simccl", vLLM's shape), its GB/s against one rank alone. The simulated
collectives carry the control messages through host memory (gloo) and run on a stream of their
own, as NCCL's do; a unit's gather takes a rendezvous of the ranks, then each copy engine's time
for its bytes, both directions at once (a machine without NVLink, where the gathered bytes cross
each rank's host bus and NCCL's ring sends while it receives).

What the figures model and what they do not: the pipeline's structure (what overlaps with what,
what waits on what, what memory it holds) with a copy engine of the given speed. Not the H200's
PCIe, NCCL's bandwidth, pinned-memory registration costs or the GPU's own copy latency: those
need a GPU (benchmarks/device_check.sh runs this script's CUDA form there).
"""

from __future__ import annotations

import argparse
import errno
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("read", "copy", "borrow", "into")
LABELS = {"read": "read alone", "copy": "copy=True", "borrow": "copy=False", "into": "load_into"}


# -- one sample, in a fresh process ------------------------------------------------------------

def _setup_device(spec: dict):
    import torch

    if spec["device"] == "cuda":
        torch.cuda.set_device(0)
        return None
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import simulated_device as simdev

    assert simdev.load(), "the simulated device was not built (INSTANTTENSOR_CMAKE_BUILD_DIR)"
    simdev.set_delays(False)
    simdev.set_timing(spec["h2d_gbps"], spec["d2h_gbps"], spec["latency_us"])
    # Copies take their modelled time without moving bytes: this machine's cores then do what
    # the host does on a GPU machine (reads, the loader's threads), not the DMA engine's work.
    simdev.set_move_bytes(spec.get("move_bytes", False))
    return simdev


def _evict(files: list[str]) -> None:
    from instanttensor._demo_bench import evict

    os.sync()
    left = evict(files)
    assert left < 0.01, f"the page cache kept {left:.0%} of a file after eviction"


STAGING_BYTES = 64 << 20  # the loader's default staging ring (ops/plan/memory_plan.h)
READ_CHUNK = 8 << 20  # the loader's default slice


def _reads_at_once(cache: str) -> int:
    """The reads the loader's backend runs at once by default: warm, one per core, at most 4;
    cold, 4."""
    return min(4, os.cpu_count() or 1) if cache == "warm" else 4


def _read_ring_bytes(device: str, cache: str, chunk: int = READ_CHUNK) -> int:
    """What of its staging ring the loader uses by default, on any device (a GPU pins the whole
    ring at allocation, but reads into this much of it): the reads its backend runs at once, one
    queued behind each, and two slices under copy (loader/transfer/staging_stream); at least one
    chunk."""
    return max(chunk, min(STAGING_BYTES, (2 * _reads_at_once(cache) + 2) * chunk))


def _loader_read_bytes(files: list[str], device: str, options: dict) -> int:
    """The read size the loader chooses for these files on this host as they are now (warm: a
    slice fitted to the CPU's last-level cache), from an open that reads no tensor."""
    import instanttensor

    with instanttensor.safe_open(files, device=device, **options) as f:
        return int(f.stats()["read_bytes"])


def _pinned_ring():
    import torch

    return torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True).numpy()


def _fresh_ring(device: str, nbytes: int, huge_pages: bool = True):
    """A staging ring made inside the timing, as a load makes its own: pinned on a GPU (which
    faults and locks it at allocation); on the simulated device, whose pinned memory is faulted
    lazily, anonymous memory advised to 2 MiB pages as the loader advises its staging (or, with
    huge_pages=False, left in 4 KiB pages)."""
    if device == "cuda":  # pinned whole, as the loader pins its ring, then read into in part
        import torch

        whole = max(nbytes, STAGING_BYTES)
        return torch.empty(whole, dtype=torch.uint8, pin_memory=True).numpy()[:nbytes]
    import mmap

    import numpy

    block = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        block.madvise(mmap.MADV_HUGEPAGE)
    return numpy.frombuffer(block, dtype=numpy.uint8)


def _read_alone(files: list[str], ring, threads: int = 2, direct: bool = False,
                chunk: int = READ_CHUNK) -> None:
    """Reads by `threads` threads, `chunk` bytes each (the loader's read size; buffered, or with
    O_DIRECT: the ring's slots are page-aligned), in turn into the slots of `ring` (the staging
    the loader uses, no smaller: a smaller buffer read over and over stays in the CPU's caches
    and would read faster than the loader's ring does), no copies."""
    jobs = []
    for path in files:
        size = os.path.getsize(path)
        jobs += [(path, offset) for offset in range(0, size, chunk)]
    slots = [ring[i:i + chunk] for i in range(0, len(ring) - chunk + 1, chunk)]
    lock = threading.Lock()
    turn = [0]
    read = [0]
    errors: list[BaseException] = []

    def worker():
        fds = {}
        try:
            while True:
                with lock:
                    if not jobs or errors:
                        break
                    path, offset = jobs.pop(0)
                    slot = slots[turn[0] % len(slots)]
                    turn[0] += 1
                fd = fds.get(path) or fds.setdefault(
                    path, os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0)))
                got = os.preadv(fd, [slot], offset)
                with lock:
                    read[0] += got
        except BaseException as error:  # re-raised below: a read that failed is no ceiling
            with lock:
                errors.append(error)
        finally:
            for fd in fds.values():
                os.close(fd)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    expected = sum(os.path.getsize(path) for path in files)
    if read[0] != expected:
        raise RuntimeError(f"the read alone read {read[0]} bytes of {expected}")


def _simulator_cpu(simdev) -> float:
    """CPU seconds simulating the device has cost the host so far: its streams' threads, and the
    host's threads waking them for each copy (a GPU's copy engine costs neither)."""
    if not simdev:
        return 0.0
    counters = simdev.counters()
    return counters["worker_cpu_seconds"] + counters["wake_cpu_seconds"]


def _threads_cpu() -> dict:
    """Per live thread of this process (by id): its role and what it has run so far and waited
    for a core, in seconds (/proc/self/task/*/schedstat). Roles: the loader's threads (named
    it-*: its read workers, and any read-ahead or lease thread), the simulator's stream threads
    (simdev-*), the consumer (the main thread, which runs the loader's pass), and any other."""
    threads: dict = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                ran, waited = (int(v) for v in stat.read().split()[:2])
        except OSError:  # the thread ended between the listing and the read
            continue
        role = ("consumer" if int(tid) == os.getpid() else "loader workers"
                if name.startswith("it-") else "simulator" if name.startswith("simdev")
                else "other")
        threads[tid] = (role, ran / 1e9, waited / 1e9)
    return threads


def _threads_cpu_since(before: dict, seconds: float) -> dict:
    """Each role's CPU and wait for a core since `before`, summed over the threads alive now
    (one started since counts from 0; one ended since is lost, so take this before the close
    joins the loader's workers), and the share of the host's cores no thread of the process
    used over `seconds` of wall."""
    out: dict = {}
    for tid, (role, ran, waited) in _threads_cpu().items():
        _, ran_before, waited_before = before.get(tid, (role, 0.0, 0.0))
        entry = out.setdefault(role, {"cpu_s": 0.0, "waited_for_core_s": 0.0})
        entry["cpu_s"] += ran - ran_before
        entry["waited_for_core_s"] += waited - waited_before
    busy = sum(r["cpu_s"] for r in out.values())
    out["cores_idle"] = max(0.0, 1.0 - busy / ((os.cpu_count() or 1) * seconds))
    return out

class Probe:
    """The counters of one pass: host waits and memory (simulated device), or memory (CUDA)."""

    def __init__(self, simdev, device: str):
        import torch

        self.simdev, self.device = simdev, device
        self.torch = torch
        self.index = int(device.split(":")[1]) if ":" in device else 0
        self.handed = 0
        self.loader_peak = 0
        self.pinned_max = 0
        self.baseline = self.in_use()
        self.pinned_baseline = simdev.pinned_bytes() if simdev else 0
        self.reset()

    def in_use(self) -> int:
        if self.simdev:
            return self.simdev.device_bytes(self.index)
        return self.torch.cuda.memory_allocated(self.index)

    def reset(self) -> None:
        if self.simdev:
            self.simdev.reset_peaks()
        else:
            self.torch.cuda.reset_peak_memory_stats(self.index)

    def peak(self) -> int:
        if self.simdev:
            return self.simdev.device_bytes_peak(self.index)
        return self.torch.cuda.max_memory_allocated(self.index)

    def waits(self) -> tuple[int, int] | None:
        """(host waits that blocked, host syncs asked)."""
        if not self.simdev:
            return None
        c = self.simdev.counters()
        return c["host_waits"], c["host_syncs"]

    def handed_out(self, nbytes: int) -> None:
        """A tensor the consumer now owns: what the loader held until now is measured first."""
        self.finish()
        self.handed += nbytes
        self.reset()

    def finish(self) -> None:
        self.loader_peak = max(self.loader_peak, self.peak() - self.baseline - self.handed)
        if self.simdev:
            self.pinned_max = max(self.pinned_max,
                                  self.simdev.pinned_bytes_peak() - self.pinned_baseline)

    def pinned_peak(self) -> int | None:
        return self.pinned_max if self.simdev else None


def _synchronize(simdev, device: str) -> None:
    import torch

    if simdev:
        simdev.torch.ops.simdev.synchronize(int(device.split(":")[1]))
    else:
        torch.cuda.synchronize()


def _sample(spec: dict) -> dict:
    import torch

    import instanttensor

    simdev = _setup_device(spec)
    device = f"{spec['device']}:0"
    files = spec["files"]
    ring = _pinned_ring()  # allocated (and pinned) before any timing
    if spec["cache"] == "cold":
        _evict(files)
    else:
        _read_alone(files, ring)  # warm: every page in the cache
    result = {}
    if simdev:
        simdev.reset_engine_stats()
    if spec.get("timeline"):
        os.environ["INSTANTTENSOR_TIMELINE"] = "1"
    sim_cpu_start = _simulator_cpu(simdev)
    cpu_start = time.process_time()
    start = time.perf_counter()
    if spec["mode"] == "read":
        # Warm, the loader's own read size (before the timing): its ring in use is that many
        # slices, which this read alone reads in too.
        chunk = READ_CHUNK
        if spec["cache"] == "warm":
            chunk = _loader_read_bytes(files, device, spec.get("options") or {})
            cpu_start, start = time.process_time(), time.perf_counter()
        result["read_bytes"] = chunk
        _read_alone(files, _fresh_ring(spec["device"], _read_ring_bytes(
            spec["device"], spec["cache"], chunk)), chunk=chunk)
        result["seconds"] = time.perf_counter() - start
        result["cpu_seconds"] = time.process_time() - cpu_start
        if spec["cache"] == "warm":
            # The ceiling is the best read by any method: also into a fresh ring of 4 KiB pages.
            # On this project's VMs a fresh 2 MiB page is faulted 1.5-2x slower at some hours
            # than at others (the read alone at 5.4-6.6 GB/s into 2 MiB pages against 9.3-9.9
            # into 4 KiB ones, the loader beside them unchanged, 2026-12-07 afternoon), which
            # made the bound move with the hour rather than with the pipeline.
            if spec["device"] != "cuda":
                result["methods"] = {"2 MiB pages": result["seconds"]}
                cpu_start, start = time.process_time(), time.perf_counter()
                _read_alone(files, _fresh_ring(spec["device"], _read_ring_bytes(
                    spec["device"], spec["cache"], chunk), huge_pages=False), chunk=chunk)
                result["methods"]["4 KiB pages"] = time.perf_counter() - start
                if result["methods"]["4 KiB pages"] < result["seconds"]:
                    result["seconds"] = result["methods"]["4 KiB pages"]
                    result["cpu_seconds"] = time.process_time() - cpu_start
                # Always second in its process (not rotated): each ring is fresh memory mapped
                # for it, the first one unmapped by then.
            # The earlier figure: into a ring touched before the timing.
            start = time.perf_counter()
            _read_alone(files, ring)
            result["touched_ring_seconds"] = time.perf_counter() - start
        else:
            # The ceiling is the best read by any method, each from an evicted cache: also as
            # many threads as the loader reads with cold, buffered and O_DIRECT (2 buffered
            # threads alone fell 30-40% short of the loader's own cold rate on this machine's
            # disk, whose O_DIRECT reads were twice as fast as buffered ones, 2026-12-07).
            result["methods"] = {"buffered x2": result["seconds"]}
            threads = _reads_at_once("cold")
            for name, direct in ((f"buffered x{threads}", False), (f"O_DIRECT x{threads}", True)):
                _evict(files)
                cpu_start, start = time.process_time(), time.perf_counter()
                try:
                    _read_alone(files, _fresh_ring(spec["device"],
                                                   _read_ring_bytes(spec["device"], "cold")),
                                threads, direct)
                except OSError as error:
                    if not direct or error.errno != errno.EINVAL:
                        raise
                    continue  # a filesystem without O_DIRECT: that method is left out
                result["methods"][name] = time.perf_counter() - start
                if result["methods"][name] < result["seconds"]:
                    result["seconds"] = result["methods"][name]
                    result["cpu_seconds"] = time.process_time() - cpu_start
        return result
    if spec["mode"] == "into":
        with instanttensor.safe_open(files, device="cpu") as meta:
            shapes = {n: meta.get_tensor_metadata(n) for n in meta.keys()}
        destinations = {n: torch.empty(shape, dtype=dtype, device=device)
                        for n, (dtype, shape) in shapes.items()}
        probe = Probe(simdev, device)
        threads = _threads_cpu()
        start, pass_start = time.perf_counter(), time.monotonic()
        with instanttensor.safe_open(files, device=device, **spec.get("options", {})) as f:
            before = probe.waits()
            f.load_into(destinations)
            after = probe.waits()
            result["threads"] = _threads_cpu_since(threads, time.perf_counter() - start)
        timeline, stats = f.timeline(), f.stats()
        end = probe.waits()  # closed; the synchronize below is the benchmark's own
        _synchronize(simdev, device)
        result["seconds"] = time.perf_counter() - start
        result["cpu_seconds"] = time.process_time() - cpu_start
        result["pass_end"] = time.monotonic()
        if simdev:
            result["simulator_cpu_seconds"] = _simulator_cpu(simdev) - sim_cpu_start
        probe.finish()
    else:
        copy = spec["mode"] == "copy"
        probe = Probe(simdev, device)
        threads = _threads_cpu()
        start, pass_start = time.perf_counter(), time.monotonic()
        kept = []
        with instanttensor.safe_open(files, device=device, copy=copy,
                                     **spec.get("options", {})) as f:
            tensors = f.tensors()
            before = probe.waits()
            for _, tensor in tensors:
                if copy:
                    kept.append(tensor)
                    probe.handed_out(tensor.nbytes)
                del tensor  # borrowed: the consumer is done with the view at once
            after = probe.waits()
            result["threads"] = _threads_cpu_since(threads, time.perf_counter() - start)
            stats = f.stats()
        timeline = f.timeline()
        end = probe.waits()  # closed; the synchronize below is the benchmark's own
        _synchronize(simdev, device)
        result["seconds"] = time.perf_counter() - start
        result["cpu_seconds"] = time.process_time() - cpu_start
        result["pass_end"] = time.monotonic()
        if simdev:
            result["simulator_cpu_seconds"] = _simulator_cpu(simdev) - sim_cpu_start
        probe.finish()
        result["handed_out_bytes"] = probe.handed
        result["buffer_size"] = stats["buffer_size"]
        result["stats"] = stats
    if spec.get("timeline"):
        result.update(timeline=timeline, pass_start=pass_start, staging_bytes=stats["staging_bytes"],
                      engine_log=simdev.engine_log(0, True) if simdev else None)
    if simdev:
        # How busy the host->device engine was between the start and the last byte, and how
        # long the pass ran before its first copy and after its last.
        engine = simdev.engine_stats(0, True)
        wall = result["seconds"]
        result["engine_busy"] = engine["busy_seconds"] / wall if wall else None
        result["engine_copies"] = engine["copies"]
        result["before_first_copy_s"] = engine["first_start"] - pass_start
        result["after_last_copy_s"] = pass_start + wall - engine["last_end"]
    result["loader_device_peak_bytes"] = probe.loader_peak
    result["pinned_peak_bytes"] = probe.pinned_peak()
    if before is not None:
        result["host_waits_in_pass"] = after[0] - before[0]
        result["host_syncs_in_pass"] = after[1] - before[1]
        result["host_waits_at_end"] = end[0] - after[0]
        result["host_syncs_at_end"] = end[1] - after[1]
    return result


RANK_SCRIPT = r"""
import json, os, sys, time, torch, torch.distributed as dist
spec, rank = json.loads(sys.argv[1]), int(sys.argv[2])
sys.path.insert(0, spec["tests"])
import simulated_device as simdev
import instanttensor
assert simdev.register_collectives()
simdev.set_delays(False)
simdev.set_timing(spec["h2d_gbps"], spec["d2h_gbps"], spec["latency_us"])
# As in one process, copies take their time without moving bytes; the simulated collectives
# still move the control messages (handshake, status words) and take the copy engines' time and
# a rendezvous of the ranks for the data.
simdev.set_move_bytes(False)
world = spec["world"]
if world > 1:
    dist.init_process_group(simdev.DEVICE_GROUP, init_method="file://" + spec["store"],
                            rank=rank, world_size=world)
    dist.barrier()
device = f"simdev:{rank}"
simdev.reset_engine_stats()
start = time.perf_counter()
with instanttensor.safe_open(spec["files"], device=device, copy=True,
                             process_group=dist.group.WORLD if world > 1 else None) as f:
    kept = [t for _, t in f.tensors()]
    stats = f.stats()
torch.ops.simdev.synchronize(rank)
seconds = time.perf_counter() - start
h2d, d2h = simdev.engine_stats(rank, True), simdev.engine_stats(rank, False)
json.dump({"seconds": seconds, "bytes_read": stats["bytes_read"], "exchange": stats["exchange"],
           "h2d_busy": h2d["busy_seconds"] / seconds, "d2h_busy": d2h["busy_seconds"] / seconds,
           "stats": stats}, open(spec["out"] % rank, "w"))
if world > 1:
    dist.destroy_process_group()
"""


def _ranks(spec: dict, world: int) -> dict:
    """`world` processes (1: a rank alone, no group), each on its own simulated device."""
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "rank.py")
        open(script, "w").write(RANK_SCRIPT)
        spec = dict(spec, store=os.path.join(folder, "store"), out=os.path.join(folder, "r%d.json"),
                    tests=os.path.join(ROOT, "tests", "python"), world=world)
        procs = [subprocess.Popen([sys.executable, script, json.dumps(spec), str(r)])
                 for r in range(world)]
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise RuntimeError("a rank failed")
        ranks = [json.load(open(spec["out"] % r)) for r in range(world)]
    return {"seconds": max(r["seconds"] for r in ranks), "exchange": ranks[0]["exchange"],
            "bytes_read": [r["bytes_read"] for r in ranks],
            "h2d_busy": [round(r["h2d_busy"], 3) for r in ranks],
            "d2h_busy": [round(r["d2h_busy"], 3) for r in ranks],
            "wait_seconds": [round(r["stats"]["wait_seconds"], 3) for r in ranks],
            "exchange_seconds": [round(r["stats"]["exchange_seconds"], 3) for r in ranks]}


# -- the run -----------------------------------------------------------------------------------

def _in_fresh_process(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"sample {spec['mode']} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def place_checkpoint(size_gb: float) -> list[str]:
    from instanttensor._demo_checkpoint import write_model_like_checkpoint

    folder = f"/var/tmp/instanttensor-device-pipeline-{size_gb}"
    marker = os.path.join(folder, ".complete")
    if not os.path.exists(marker):
        write_model_like_checkpoint(folder, total_mb=int(size_gb * 1024), files=4, hidden=2048,
                                    vocab=32000)
        open(marker, "w").close()
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run(args) -> dict:
    files = place_checkpoint(args.size_gb)
    total = sum(os.path.getsize(p) for p in files)
    settings = {"copy-bound": args.copy_bound_gbps, "read-bound": args.read_bound_gbps}
    if args.device == "cuda":
        settings = {"cuda": 0.0}
    samples: dict = {}
    rounds = 0
    for round_ in range(args.samples):
        for cache in args.caches:
            for setting, gbps in settings.items():
                order = MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]
                for mode in order:
                    spec = {"mode": mode, "cache": cache, "files": files, "device": args.device,
                            "h2d_gbps": gbps, "d2h_gbps": gbps, "latency_us": args.latency_us,
                            "options": args.options}
                    key = (setting, cache, mode)
                    samples.setdefault(key, []).append(_in_fresh_process(spec))
                    print(f"  {setting} {cache} {mode}: {samples[key][-1]['seconds']:.3f} s",
                          file=sys.stderr)
        rounds += 1
    entries = []
    for setting, gbps in settings.items():
        for cache in args.caches:
            read = _median([s["seconds"] for s in samples[(setting, cache, "read")]])
            read_gbps = total / read / 1e9
            read_cores = _median([s["cpu_seconds"] / s["seconds"]
                                  for s in samples[(setting, cache, "read")]])
            read_cpu = _median([s["cpu_seconds"] for s in samples[(setting, cache, "read")]])
            touched = [s["touched_ring_seconds"] for s in samples[(setting, cache, "read")]
                       if "touched_ring_seconds" in s]
            touched_gbps = total / _median(touched) / 1e9 if touched else None
            # Each method's median rate (cold; warm: the ring's page size), the bound being the
            # best sample's method.
            method_samples: dict = {}
            for s in samples[(setting, cache, "read")]:
                for name, value in s.get("methods", {}).items():
                    method_samples.setdefault(name, []).append(total / value / 1e9)
            methods_gbps = {name: _median(v) for name, v in method_samples.items()}
            copy_gbps = gbps if args.device != "cuda" else _pinned_h2d_gbps()
            for mode in MODES[1:]:
                runs = samples[(setting, cache, mode)]
                seconds = _median([s["seconds"] for s in runs])
                # The host CPU bound: this machine's cores doing what any pipeline must (the
                # reads' copies out of the page cache into fresh staging as the read alone
                # measured them, the simulator's copies), nothing of the loader's own.
                sim_cpu = _median([s.get("simulator_cpu_seconds", 0.0) for s in runs])
                host_cpu = read_cpu + sim_cpu
                cpu_gbps = total / (host_cpu / os.cpu_count()) / 1e9
                bound, bound_by = min((read_gbps, "reads"), (copy_gbps, "copy engine"),
                                      (cpu_gbps, "host CPU"))
                entry = {"setting": setting, "cache": cache, "mode": LABELS[mode],
                         "copy_gbps": copy_gbps, "read_gbps": read_gbps, "bound_gbps": bound,
                         "bound_by": bound_by, "cpu_bound_gbps": cpu_gbps,
                         "host_cpu_seconds": {"reads": read_cpu, "simulator": sim_cpu},
                         "read_touched_ring_gbps": touched_gbps,
                         # The read size of the read alone (the loader's, asked before its
                         # timing) and of each of the loader's samples (stats()["read_bytes"]).
                         "read_alone_read_bytes": [s.get("read_bytes")
                                                   for s in samples[(setting, cache, "read")]],
                         "samples_read_bytes": [s.get("stats", {}).get("read_bytes")
                                                for s in runs],
                         "read_alone_methods_gbps": methods_gbps,
                         "seconds": seconds, "gbps": total / seconds / 1e9,
                         "ratio_to_bound": total / seconds / 1e9 / bound,
                         "samples_seconds": [s["seconds"] for s in runs],
                         # Host cores the process kept busy (CPU seconds / wall), and the read
                         # alone's: near the core count, this machine's CPU is the bound.
                         "host_cores": _median([s["cpu_seconds"] / s["seconds"] for s in runs]),
                         "read_alone_host_cores": read_cores,
                         # The read method each sample used (cold: timed, and why).
                         "samples_backend": [s.get("stats", {}).get("backend") for s in runs]}
                # Where the host's CPU went in the pass, by thread role (medians of the samples):
                # the loader's workers against the read alone's threads (the same reads), the
                # consumer (the loader's own work: booking reads, queueing copies, handing out
                # tensors), the simulator's copy threads, and the cores left idle.
                roles = sorted({r for s in runs for r in s.get("threads", {}) if r != "cores_idle"})
                entry["threads"] = {
                    role: {field: _median([s["threads"].get(role, {}).get(field, 0.0)
                                           for s in runs if "threads" in s])
                           for field in ("cpu_s", "waited_for_core_s")}
                    for role in roles}
                entry["cores_idle"] = _median([s["threads"]["cores_idle"] for s in runs
                                               if "threads" in s]) if roles else None
                for field in ("engine_busy", "before_first_copy_s", "after_last_copy_s",
                              "host_waits_in_pass", "host_syncs_in_pass", "host_waits_at_end",
                              "host_syncs_at_end",
                              "loader_device_peak_bytes", "pinned_peak_bytes", "handed_out_bytes",
                              "buffer_size"):
                    entry[field] = _median([s.get(field) for s in runs])
                entries.append(entry)
    two = []
    if args.device == "simdev" and args.ranks:
        for setting, gbps in settings.items():
            spec = {"files": files, "h2d_gbps": gbps, "d2h_gbps": gbps,
                    "latency_us": args.latency_us}
            _read_alone_in_process(files)  # warm for every rank
            runs, alone = [], []
            for round_ in range(args.samples):  # interleaved, the order rotating
                for world in ((2, 1) if round_ % 2 == 0 else (1, 2)):
                    (runs if world == 2 else alone).append(_ranks(spec, world))
            seconds = _median([r["seconds"] for r in runs])
            alone_seconds = _median([r["seconds"] for r in alone])
            two.append({"setting": setting, "cache": "warm", "mode": "copy=True, 2 ranks",
                        "gbps_per_rank": total / seconds / 1e9,
                        "one_rank_gbps": total / alone_seconds / 1e9,
                        "ratio_to_one_rank": alone_seconds / seconds,
                        "exchange": runs[0]["exchange"], "bytes_read": runs[0]["bytes_read"],
                        "h2d_busy_per_rank": _median([statistics.mean(r["h2d_busy"])
                                                      for r in runs]),
                        "samples_seconds": [r["seconds"] for r in runs],
                        "one_rank_samples_seconds": [r["seconds"] for r in alone]})
    return {"device": args.device, "checkpoint_bytes": total, "files": len(files),
            "samples": rounds, "latency_us": args.latency_us, "options": args.options,
            "entries": entries,
            "two_ranks": two}


def _read_alone_in_process(files):
    for path in files:
        with open(path, "rb") as handle:
            while handle.read(16 << 20):
                pass


def _pinned_h2d_gbps() -> float:
    from device_bench import pinned_h2d_gbps  # the GPU check's ceiling, beside this file

    return pinned_h2d_gbps(256 << 20)


def _mib(value) -> str:
    return "-" if value is None else f"{value / (1 << 20):.1f}"


def print_table(result: dict) -> None:
    print(f"checkpoint: {result['checkpoint_bytes'] / 1e9:.2f} GB in {result['files']} files, "
          f"device {result['device']}, medians of {result['samples']}, {os.cpu_count()} cores")
    print("| setting | cache | mode | GB/s | bound GB/s (by) | ratio | host CPU bound GB/s "
          "(simulator CPU s) | read alone GB/s by method (warm: and into a touched ring) "
          "| host cores busy (read alone) "
          "| host waits (syncs) in pass | at end | loader device peak MiB | pinned peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for e in result["entries"]:
        touched = e.get("read_touched_ring_gbps")
        touched = "-" if touched is None else f"{touched:.2f}"
        if e.get("read_alone_methods_gbps"):
            methods = ", ".join(f"{name} {gbps:.2f}"
                                for name, gbps in e["read_alone_methods_gbps"].items())
            touched = methods if touched == "-" else f"{methods}; touched {touched}"
        waits = "- | -" if e["host_waits_in_pass"] is None else \
            f"{e['host_waits_in_pass']:.0f} ({e['host_syncs_in_pass']:.0f}) | " \
            f"{e['host_waits_at_end']:.0f} ({e['host_syncs_at_end']:.0f})"
        print(f"| {e['setting']} | {e['cache']} | {e['mode']} | {e['gbps']:.2f} | "
              f"{e['bound_gbps']:.2f} ({e['bound_by']}) | {e['ratio_to_bound']:.2f} | "
              f"{e['cpu_bound_gbps']:.2f} ({e['host_cpu_seconds']['simulator']:.3f}) | "
              f"{touched} | "
              f"{e['host_cores']:.2f} ({e['read_alone_host_cores']:.2f}) | {waits} | "
              f"{_mib(e['loader_device_peak_bytes'])} | {_mib(e['pinned_peak_bytes'])} |")
    for e in result["two_ranks"]:
        print(f"| {e['setting']} | warm | {e['mode']} | {e['gbps_per_rank']:.2f} per rank | "
              f"one rank alone {e['one_rank_gbps']:.2f} | {e['ratio_to_one_rank']:.2f} x alone | | | "
              f"| {e['exchange']} | | | |")
    print_threads_table(result)


def print_threads_table(result: dict) -> None:
    """Where the host's CPU went in each pass (ms, medians): what bounds a cell the CPU bounds."""
    print("| setting | cache | mode | pass ms (to the synchronize) | CPU ms to the last tensor: "
          "loader workers (read alone, all threads) "
          "/ consumer / simulator / other | waited for a core ms: workers / consumer / simulator "
          "| cores idle |")
    print("|---|---|---|---|---|---|---|")
    for e in result["entries"]:
        t = e.get("threads") or {}
        if not t:
            continue

        def ms(role, field="cpu_s"):
            return f"{1000 * t.get(role, {}).get(field, 0.0):.1f}"

        print(f"| {e['setting']} | {e['cache']} | {e['mode']} | {1000 * e['seconds']:.1f} | "
              f"{ms('loader workers')} ({1000 * e['host_cpu_seconds']['reads']:.1f}) / "
              f"{ms('consumer')} / {ms('simulator')} / {ms('other')} | "
              f"{ms('loader workers', 'waited_for_core_s')} / "
              f"{ms('consumer', 'waited_for_core_s')} / {ms('simulator', 'waited_for_core_s')} | "
              f"{e['cores_idle']:.2f} |")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(e["setting"], e["cache"]) for e in result["entries"]})
    modes = [LABELS[m] for m in MODES[1:]]
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        values = [next(e["ratio_to_bound"] for e in result["entries"]
                       if (e["setting"], e["cache"]) == g and e["mode"] == mode) for g in groups]
        axis.bar([x + i * width for x in range(len(groups))], values, width, label=mode)
    axis.axhline(0.9, color="gray", linestyle="--", linewidth=1, label="goal 0.9")
    axis.set_xticks([x + width for x in range(len(groups))])
    axis.set_xticklabels([f"{s}\n{c}" for s, c in groups])
    axis.set_ylabel("GB/s / bound of the slower stage")
    axis.set_title(f"device pipeline on {result['device']}, "
                   f"{result['checkpoint_bytes'] / 1e9:.2f} GB")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def timeline_cells(args, files: list[str]) -> list[dict]:
    """One pass per cell recorded with INSTANTTENSOR_TIMELINE=1, in a fresh process each."""
    import pipeline_timeline

    settings = {"copy-bound": args.copy_bound_gbps, "read-bound": args.read_bound_gbps}
    if args.device == "cuda":
        settings = {"cuda": 0.0}
    cells = []
    for setting, gbps in settings.items():
        for cache in args.caches:
            for mode in MODES[1:]:
                spec = {"mode": mode, "cache": cache, "files": files, "device": args.device,
                        "h2d_gbps": gbps, "d2h_gbps": gbps, "latency_us": args.latency_us,
                        "timeline": True, "options": args.options}
                sample = _in_fresh_process(spec)
                cells.append({"setting": setting, "cache": cache, "mode": LABELS[mode],
                              "sample": sample, "analysis": pipeline_timeline.analyse(sample)})
    return cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--caches", default="warm,cold")
    parser.add_argument("--device", choices=("simdev", "cuda"), default=None)
    parser.add_argument("--copy-bound-gbps", type=float, default=1.0)
    parser.add_argument("--read-bound-gbps", type=float, default=40.0)
    parser.add_argument("--latency-us", type=float, default=10.0)
    parser.add_argument("--no-ranks", dest="ranks", action="store_false")
    parser.add_argument("--options", type=json.loads, default={},
                        help="safe_open options for every pass, as JSON (to try settings)")
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--timeline", metavar="PNG",
                        help="one more pass per cell with the loader's timeline: a summary of "
                             "what bounds it, the plot, and its events in PNG's .json")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_sample(json.loads(args.worker))))
        return 0
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "simdev"
    if args.device == "simdev":
        os.environ.setdefault("INSTANTTENSOR_CMAKE_BUILD_DIR", os.path.join(ROOT, "build"))
    args.caches = args.caches.split(",")
    if args.samples > 0:
        result = run(args)
        print_table(result)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(result, out, indent=1)
        if args.plot:
            plot(result, args.plot)
    if args.timeline:
        import pipeline_timeline

        cells = timeline_cells(args, place_checkpoint(args.size_gb))
        pipeline_timeline.print_summary(cells)
        with open(os.path.splitext(args.timeline)[0] + ".json", "w") as out:
            json.dump(cells, out)
        try:
            pipeline_timeline.plot(cells, args.timeline)
        except ImportError as missing:  # a bare GPU machine: the JSON holds every event
            print(f"timeline plot skipped: {missing}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
