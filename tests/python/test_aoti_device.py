"""load_constants on a runner whose constants live on an accelerator (CUDA where present, else the
simulated device, for which AOTInductor cannot compile): torch's AOTIModelContainerRunner over a
model library built by hand (tests/aoti/fake_model_library.cpp: one Linear layer, AOTInductor's
constant buffers), through the test-only torch.classes.instanttensor_testing.LibraryRunner.
The bytes go disk -> pinned staging -> the package's device buffer, once."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from safetensors.torch import save_file

import instanttensor  # noqa: F401  (loads the engine)
import simulated_device
from test_accelerator import KIND, Device
from test_distributed import fault_library  # reads the build folder at import, before fixtures

pytestmark = pytest.mark.skipif(KIND is None, reason="no GPU, and the simulated device was not "
                                "built (INSTANTTENSOR_CMAKE_BUILD_DIR)")


def model_library() -> str:
    path = os.path.join(simulated_device.build_dir() or "", "libinstanttensor_fake_aoti_model.so")
    if not os.path.exists(path):
        pytest.skip("needs the CMake build's test model library (INSTANTTENSOR_CMAKE_BUILD_DIR)")
    return path


@pytest.fixture
def testing():
    torch.ops.load_library(fault_library())
    yield torch.ops.instanttensor_testing
    torch.ops.instanttensor_testing.disarm_faults()


@pytest.fixture
def accel():
    device = Device(KIND)
    yield device
    device.synchronize()


def linear_checkpoint(path: str, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    tensors = {"linear.weight": torch.randn(4, 3), "linear.bias": torch.randn(4)}
    save_file(tensors, path)
    return tensors


def expected(tensors: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.addmm(tensors["linear.bias"], x, tensors["linear.weight"].t())


def runner_on(device: str, testing):
    return torch.classes.instanttensor_testing.LibraryRunner(model_library(), device)


def test_constants_land_in_the_packages_device_buffers(tmp_path, accel, testing):
    first = linear_checkpoint(str(tmp_path / "first.safetensors"), 1)
    runner = runner_on(f"{KIND}:0", testing)
    pinned_before = accel.pinned()
    fqns, nbytes = runner.load_constants([str(tmp_path / "first.safetensors")],
                                         staging_size=32 << 10)
    assert sorted(fqns) == sorted(first) and nbytes == 64
    held = runner.constants(False)
    for name, tensor in first.items():
        assert held[name].device.type == KIND
        assert torch.equal(held[name].cpu(), tensor)
    # the slots of the one device buffer the package allocated: the bytes were read into it
    weight, bias = held["linear.weight"], held["linear.bias"]
    assert weight.data_ptr() + weight.nbytes == bias.data_ptr()
    x = torch.randn(2, 3)
    torch.testing.assert_close(runner.run(x.to(f"{KIND}:0")).cpu(), expected(first, x))
    assert accel.pinned() == pinned_before  # the staging ring went back


def test_swap_while_serving_on_the_device(tmp_path, accel, testing):
    paths = [str(tmp_path / f"{name}.safetensors") for name in ("first", "second")]
    first, second = linear_checkpoint(paths[0], 1), linear_checkpoint(paths[1], 2)
    runner = runner_on(f"{KIND}:0", testing)
    runner.load_constants([paths[0]])
    x = torch.randn(2, 3)
    testing.hold_reads()
    failures = []

    def refresh():
        try:
            runner.load_constants([paths[1]], use_inactive=True, backend="pread")
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    loader = threading.Thread(target=refresh)
    loader.start()
    try:
        testing.wait_for_held_read()
        for _ in range(3):  # the load is underway; the active weights serve
            torch.testing.assert_close(runner.run(x.to(KIND)).cpu(), expected(first, x))
    finally:
        testing.release_held_reads()
        loader.join()
    assert failures == []
    runner.swap_constant_buffer()
    torch.testing.assert_close(runner.run(x.to(KIND)).cpu(), expected(second, x))
    held = accel.allocated()
    runner.free_inactive_constant_buffer()  # the first weights' buffer
    assert accel.allocated() < held
    runner.load_constants([paths[0]], use_inactive=True)  # a fresh buffer, filled again
    runner.swap_constant_buffer()
    torch.testing.assert_close(runner.run(x.to(KIND)).cpu(), expected(first, x))


def test_a_read_failure_frees_the_inactive_buffer_and_the_staging_ring(tmp_path, accel, testing):
    paths = [str(tmp_path / f"{name}.safetensors") for name in ("first", "second")]
    first = linear_checkpoint(paths[0], 1)
    linear_checkpoint(paths[1], 2)
    runner = runner_on(f"{KIND}:0", testing)
    runner.load_constants([paths[0]])
    pinned_before = accel.pinned()
    held = accel.allocated()
    testing.arm_read_fault(1, 5)
    with pytest.raises(RuntimeError, match="second.safetensors"):
        runner.load_constants([paths[1]], use_inactive=True, backend="pread")
    testing.disarm_faults()
    assert accel.allocated() == held  # the inactive buffer it allocated is freed
    x = torch.randn(2, 3)
    torch.testing.assert_close(runner.run(x.to(KIND)).cpu(), expected(first, x))
    assert accel.pinned() == pinned_before


def test_the_staged_transfer_on_a_cpu_runner(tmp_path, testing):
    first = linear_checkpoint(str(tmp_path / "first.safetensors"), 3)
    runner = runner_on("cpu", testing)
    runner.load_constants([str(tmp_path / "first.safetensors")], force_staging=True,
                          staging_size=32 << 10)
    x = torch.randn(2, 3)
    torch.testing.assert_close(runner.run(x), expected(first, x))
