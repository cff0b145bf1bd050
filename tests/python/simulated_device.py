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


def library_path() -> str | None:
    build = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")
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


def set_delays(on: bool) -> None:
    torch.ops.simdev.set_delays(bool(on))


def pinned_bytes() -> int:
    """Pinned host bytes the simulated device's host allocator holds now."""
    return int(torch.ops.simdev.pinned_bytes())


def device_bytes(index: int = 0) -> int:
    return int(torch.ops.simdev.device_bytes(index))


def accelerator() -> str | None:
    """'cuda' where a GPU is present, else 'simdev' where it was built, else None."""
    if torch.cuda.is_available():
        return "cuda"
    return NAME if load() else None
