"""Helper: the simulated accelerator (tests/simulated_device, torch's PrivateUse1 backend) under
the name "simdev", for the device tests on machines without a GPU.

`accelerator()` answers which device the device tests run on: CUDA where a GPU is present, else
the simulated device when the CMake build's library is there (INSTANTTENSOR_CMAKE_BUILD_DIR).
"""

from __future__ import annotations

import os
import types

import torch

NAME = "simdev"
_loaded = False


# Read at import too: the suite's autouse fixture clears INSTANTTENSOR_* variables for each test.
_BUILD_DIR_AT_IMPORT = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")
DELAYS_AT_IMPORT = os.environ.get("INSTANTTENSOR_SIMDEV_DELAY")


def build_dir() -> str | None:
    return os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR") or _BUILD_DIR_AT_IMPORT


def library_path() -> str | None:
    build = build_dir()
    path = os.path.join(build or "", "libinstanttensor_simdev.so")
    return path if build and os.path.exists(path) else None


def load() -> bool:
    """Loads and names the simulated device once per process; False when it was not built."""
    global _loaded
    if _loaded:
        return True
    path = library_path()
    if path is None:
        return False
    torch.ops.load_library(path)
    torch.utils.rename_privateuse1_backend(NAME)
    ops = torch.ops.simdev
    module = types.ModuleType(f"torch.{NAME}")
    module.is_available = lambda: True
    module.device_count = lambda: 2
    module.current_device = lambda: int(ops.current_device())
    module.set_device = lambda index: ops.set_device(int(index))
    module.mem_get_info = lambda index=None: tuple(
        ops.mem_get_info(module.current_device() if index is None else int(index)))
    module.synchronize = lambda index=None: ops.synchronize(
        module.current_device() if index is None else int(index))
    # What torch's generic code asks of any accelerator module (AOT autograd saves and restores
    # the RNG state of every registered one): a device without random numbers.
    module._is_in_bad_fork = lambda: False
    module.manual_seed = module.manual_seed_all = lambda seed: None
    module.seed = module.seed_all = lambda: None
    module.initial_seed = lambda: 0
    module.get_rng_state = lambda device=None: torch.empty(0, dtype=torch.uint8)
    module.get_rng_state_all = lambda: []
    module.set_rng_state = lambda state, device=None: None
    module.set_rng_state_all = lambda states: None
    torch._register_device_module(NAME, module)
    torch.utils.generate_methods_for_privateuse1_backend()
    _loaded = True
    return True


BACKEND = "simccl"
# The shape of vLLM's device group on a GPU ("cpu:gloo,cuda:nccl") on the simulated device.
DEVICE_GROUP = f"cpu:gloo,{NAME}:{BACKEND}"
_collectives_registered = False


def register_collectives() -> bool:
    """Registers the simulated device's c10d backend ("simccl", tests/simulated_device/
    sim_collectives.h) for "simdev" once per process; False when it was not built. Call before
    init_process_group(DEVICE_GROUP)."""
    global _collectives_registered
    if _collectives_registered:
        return True
    if not load():
        return False
    build = build_dir()
    if not os.path.exists(os.path.join(build, "instanttensor_simccl.so")):
        return False
    import importlib.util
    import torch.distributed as dist
    spec = importlib.util.spec_from_file_location(
        "instanttensor_simccl", os.path.join(build, "instanttensor_simccl.so"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def create(store, rank, size, timeout):
        # gloo carries the bytes between the ranks' host memories, under its own store prefix.
        host = dist.ProcessGroupGloo(dist.PrefixStore(BACKEND, store), rank, size, timeout)
        return module.create_backend(host, rank, size)

    dist.Backend.register_backend(BACKEND, create, devices=[NAME])
    globals()["pending_collectives"] = module.pending
    _collectives_registered = True
    return True


def set_delays(on: bool) -> None:
    torch.ops.simdev.set_delays(bool(on))


def set_pinned_limit(nbytes: int) -> None:
    """A locked-memory limit: pinning beyond `nbytes` in use is refused (negative: none)."""
    torch.ops.simdev.set_pinned_limit(int(nbytes))


def pinned_bytes() -> int:
    """Pinned host bytes the simulated device's host allocator holds now."""
    return int(torch.ops.simdev.pinned_bytes())


def device_bytes(index: int = 0) -> int:
    return int(torch.ops.simdev.device_bytes(index))


def set_timing(h2d_gbps: float, d2h_gbps: float, latency_us: float = 0.0) -> None:
    """The timing model: one copy engine per direction per device (0 GB/s: off)."""
    torch.ops.simdev.set_timing(float(h2d_gbps), float(d2h_gbps), float(latency_us))


def counters() -> dict:
    """Since the process started: host syncs (a host thread asking to wait for the device), host
    waits (those that blocked), queries answered "not yet", and the CPU seconds the streams'
    worker threads spent (queued work, waking for it, queue handling) and the CPU seconds the
    host's threads spent waking those workers for new work: together, what simulating the device
    costs the host."""
    waits, syncs, polls, cpu, wakes = torch.ops.simdev.counters()
    return {"host_waits": int(waits), "host_syncs": int(syncs), "pending_polls": int(polls),
            "worker_cpu_seconds": cpu, "wake_cpu_seconds": wakes}


def set_move_bytes(on: bool) -> None:
    """Benchmarks only: off, copies and kernels take their modelled time without moving bytes."""
    torch.ops.simdev.set_move_bytes(bool(on))


def engine_stats(index: int = 0, h2d: bool = True) -> dict:
    """What a copy engine did since reset_engine_stats: copies, busy seconds (modelled), and
    when the first began and the last ended (time.monotonic)."""
    copies, busy, first, last = torch.ops.simdev.engine_stats(index, h2d)
    return {"copies": int(copies), "busy_seconds": busy, "first_start": first, "last_end": last}


def engine_log(index: int = 0, h2d: bool = True) -> list[tuple[float, float, int]]:
    """Each copy of that engine since reset_engine_stats: (start, end, bytes), time.monotonic."""
    flat = torch.ops.simdev.engine_log(index, h2d)
    return [(flat[i], flat[i + 1], int(flat[i + 2])) for i in range(0, len(flat), 3)]


def reset_engine_stats() -> None:
    torch.ops.simdev.reset_engine_stats()


def stale_accesses() -> int:
    """Queued copies, since the library loaded, that found their device memory already freed
    (a free ordered before work still queued on another stream); they moved nothing."""
    return int(torch.ops.simdev.stale_accesses())


def reset_peaks() -> None:
    torch.ops.simdev.reset_peaks()


def device_bytes_peak(index: int = 0) -> int:
    return int(torch.ops.simdev.device_bytes_peak(index))


def pinned_bytes_peak() -> int:
    return int(torch.ops.simdev.pinned_bytes_peak())


def accelerator() -> str | None:
    """'cuda' where a GPU is present, else 'simdev' where it was built, else None."""
    if torch.cuda.is_available():
        return "cuda"
    return NAME if load() else None
