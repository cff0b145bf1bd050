"""AOTInductor packages whose weights come from checkpoints: instanttensor.aoti (the engine's
torch.classes.instanttensor.AOTIPackage) and torch's own aoti_load_package object."""

from __future__ import annotations

import threading
from typing import List

import pytest
import torch
from safetensors.torch import save_file

import instanttensor
from aoti_model import EXAMPLE_SHAPE, block, packages, weights
from instanttensor import aoti
from test_distributed import fault_library  # reads the build folder at import, before fixtures


@pytest.fixture(scope="module")
def compiled() -> tuple[str, str]:
    return packages()


@pytest.fixture
def checkpoints(tmp_path):
    """Two checkpoints of the block with weights other than those it was compiled with."""
    first, second = block(1), block(2)
    paths = str(tmp_path / "first.safetensors"), str(tmp_path / "second.safetensors")
    save_file(weights(first), paths[0])
    save_file(weights(second), paths[1])
    return (paths[0], first), (paths[1], second)


@pytest.fixture
def faults():
    torch.ops.load_library(fault_library())
    yield torch.ops.instanttensor_testing
    torch.ops.instanttensor_testing.disarm_faults()


def example() -> torch.Tensor:
    torch.manual_seed(7)
    return torch.randn(*EXAMPLE_SHAPE)


def assert_serves(package, model) -> None:
    x = example()
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(package(x), expected)


def test_outputs_equal_eager_with_the_checkpoints_weights(compiled, checkpoints):
    (path, model), _ = checkpoints
    package = aoti.load_package(compiled[0])
    report = aoti.load_constants(package, path)
    names = sorted(weights(model))
    assert report.constants == names == package.get_constant_fqns()
    assert report.unused_tensors == []
    assert report.bytes == sum(t.nbytes for t in weights(model).values())
    assert_serves(package, model)
    with torch.no_grad():  # the weights it was compiled with are not what it runs
        assert not torch.allclose(package(example()), block(0)(example()))


def test_a_prefix_or_a_rename_names_the_checkpoints_tensors(compiled, checkpoints, tmp_path):
    (_, model), _ = checkpoints
    prefixed = str(tmp_path / "prefixed.safetensors")
    save_file({"model." + k: v for k, v in weights(model).items()}, prefixed)
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, prefixed, prefix="model.")
    assert_serves(package, model)
    renamed = str(tmp_path / "renamed.safetensors")
    save_file({k.replace(".", "/"): v for k, v in weights(model).items()}, renamed)
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, [renamed], rename=lambda fqn: fqn.replace(".", "/"))
    assert_serves(package, model)


def test_tensors_no_constant_takes_are_an_error_unless_not_strict(compiled, checkpoints,
                                                                  tmp_path):
    (_, model), _ = checkpoints
    extra = str(tmp_path / "extra.safetensors")
    save_file({**weights(model), "lm_head.weight": torch.randn(4, 4)}, extra)
    package = aoti.load_package(compiled[0])
    with pytest.raises(KeyError, match=r"extra.safetensors.*lm_head.weight"):
        aoti.load_constants(package, extra)
    report = aoti.load_constants(package, extra, strict=False)
    assert report.unused_tensors == ["lm_head.weight"]
    assert_serves(package, model)


def test_bad_checkpoints_are_refused_before_the_served_weights_change(compiled, checkpoints,
                                                                      tmp_path):
    (path, model), _ = checkpoints
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, path)
    good = weights(model)
    missing = str(tmp_path / "missing.safetensors")
    save_file({k: v for k, v in good.items() if k != "proj.weight"}, missing)
    other_dtype = str(tmp_path / "bf16.safetensors")
    save_file({**good, "qkv.weight": good["qkv.weight"].bfloat16()}, other_dtype)
    other_shape = str(tmp_path / "shape.safetensors")
    save_file({**good, "mlp_in.weight": torch.randn(32, 64)}, other_shape)
    for use_inactive in (False, True):
        with pytest.raises(KeyError, match=r"missing.safetensors.*proj.weight"):
            aoti.load_constants(package, missing, use_inactive=use_inactive)
        with pytest.raises(ValueError, match=r"bf16.safetensors: tensor 'qkv.weight'.*float32.*"
                                             r"bfloat16"):
            aoti.load_constants(package, other_dtype, use_inactive=use_inactive)
        with pytest.raises(ValueError, match=r"shape.safetensors: tensor 'mlp_in.weight'.*"
                                             r"\[64, 32\].*\[32, 64\]"):
            aoti.load_constants(package, other_shape, use_inactive=use_inactive)
        assert_serves(package, model)


def test_a_shape_learned_at_the_first_load_refuses_and_the_package_runs_nothing(
        compiled, checkpoints, tmp_path):
    (path, model), _ = checkpoints
    other_shape = str(tmp_path / "shape.safetensors")
    save_file({**weights(model), "proj.weight": torch.randn(16, 64)}, other_shape)
    package = aoti.load_package(compiled[0])
    with pytest.raises(ValueError, match=r"tensor 'proj.weight'.*\[32, 32\].*\[16, 64\]"):
        aoti.load_constants(package, other_shape)
    with pytest.raises(RuntimeError, match="constant state"):
        package(example())  # never unchecked or unfilled weights
    aoti.load_constants(package, path)
    assert_serves(package, model)


def test_a_package_with_its_constants_inside_is_refused(compiled, checkpoints):
    (path, _), _ = checkpoints
    package = aoti.load_package(compiled[1])
    with pytest.raises(ValueError, match="package_constants_in_so"):
        aoti.load_constants(package, path)
    with torch.no_grad():  # its own weights still serve
        torch.testing.assert_close(package(example()), block(0)(example()))


def test_swap_while_serving_runs_the_old_weights_during_the_load(compiled, checkpoints, faults):
    (first_path, first), (second_path, second) = checkpoints
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, first_path)
    faults.hold_reads()  # the load below waits at its first read until released
    failures = []

    def refresh():
        try:
            aoti.load_constants(package, second_path, use_inactive=True, backend="pread")
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    loader = threading.Thread(target=refresh)
    loader.start()
    try:
        faults.wait_for_held_read()  # the load is underway: its reads have started
        for _ in range(3):
            assert_serves(package, first)
    finally:
        faults.release_held_reads()
        loader.join()
    assert failures == []
    assert_serves(package, first)  # loaded, not swapped yet
    package.swap_constant_buffer()
    assert_serves(package, second)
    package.free_inactive_constant_buffer()
    assert_serves(package, second)
    aoti.load_constants(package, first_path, use_inactive=True)  # the freed buffer, again
    package.swap_constant_buffer()
    assert_serves(package, first)


def test_a_load_failing_midway_leaves_the_served_weights(compiled, checkpoints, faults,
                                                         tmp_path):
    (first_path, first), (second_path, second) = checkpoints
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, first_path)
    faults.arm_read_fault(1, 5)  # EIO on the first read, once the package allocated its buffer
    with pytest.raises(OSError, match="second.safetensors"):
        aoti.load_constants(package, second_path, use_inactive=True, backend="pread")
    faults.disarm_faults()
    assert_serves(package, first)
    truncated = str(tmp_path / "truncated.safetensors")
    with open(second_path, "rb") as source:
        data = source.read()
    with open(truncated, "wb") as out:
        out.write(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated.safetensors"):
        aoti.load_constants(package, truncated, use_inactive=True)
    assert_serves(package, first)
    aoti.load_constants(package, second_path, use_inactive=True)
    package.swap_constant_buffer()
    assert_serves(package, second)


def test_a_load_into_the_active_buffer_failing_midway_leaves_nothing_to_run(
        compiled, checkpoints, faults):
    (first_path, first), (second_path, second) = checkpoints
    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, first_path)
    faults.arm_read_fault(1, 5)
    with pytest.raises(OSError, match="second.safetensors"):
        aoti.load_constants(package, second_path, backend="pread")
    faults.disarm_faults()
    with pytest.raises(RuntimeError, match="constant state"):
        package(example())  # part old, part new: refused
    aoti.load_constants(package, second_path)
    assert_serves(package, second)


def test_torchs_own_package_object_takes_the_checkpoint_only_unchecked(compiled, checkpoints,
                                                                         tmp_path):
    (path, model), _ = checkpoints
    package = torch._inductor.aoti_load_package(compiled[0])
    with pytest.raises(ValueError, match="unchecked=True"):
        instanttensor.load_constants(package, path)
    report = instanttensor.load_constants(package, path, unchecked=True)
    assert report.constants == sorted(weights(model))
    assert_serves(package, model)
    missing = str(tmp_path / "missing.safetensors")
    save_file({k: v for k, v in weights(model).items() if k != "norm.bias"}, missing)
    with pytest.raises(KeyError, match="norm.bias"):
        instanttensor.load_constants(package, missing, unchecked=True)
    with pytest.raises(ValueError, match="swap_constant_buffer"):
        instanttensor.load_constants(package, path, use_inactive=True, unchecked=True)
    assert_serves(package, model)


def test_torchscript_drives_the_package_class(compiled, checkpoints):
    (first_path, first), (second_path, second) = checkpoints

    @torch.jit.script
    def refresh(package: torch.classes.instanttensor.AOTIPackage, files: List[str]) -> int:
        loaded = package.load_constants(files, use_inactive=True)
        package.swap_constant_buffer()
        package.free_inactive_constant_buffer()
        return loaded[2]

    package = aoti.load_package(compiled[0])
    aoti.load_constants(package, first_path)
    assert refresh(package.handle, [second_path]) == sum(
        t.nbytes for t in weights(second).values())
    assert_serves(package, second)


def test_a_package_that_is_no_package_or_is_missing_names_the_path(tmp_path):
    bogus = tmp_path / "bogus.pt2"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bogus.pt2: not an AOTInductor package.*zip"):
        aoti.load_package(str(bogus))
    with pytest.raises(FileNotFoundError, match="missing.pt2"):
        aoti.load_package(str(tmp_path / "missing.pt2"))
    with pytest.raises(ValueError, match="device_index=-7"):
        aoti.load_package(str(bogus), device_index=-7)


def test_constants_the_package_folds_come_from_no_checkpoint(tmp_path):
    from aoti_model import Folded, folding_package

    package = aoti.load_package(folding_package())
    assert any(fqn.startswith("_FOLDED_CONST") for fqn in package.get_constant_fqns())
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(Folded().eval())
        save_file(weights(models[-1]), str(tmp_path / f"{seed}.safetensors"))
    x = torch.randn(4, 32)
    report = aoti.load_constants(package, str(tmp_path / "1.safetensors"))
    assert report.constants == ["b", "w"]
    with torch.no_grad():
        torch.testing.assert_close(package(x), models[0](x))
        aoti.load_constants(package, str(tmp_path / "2.safetensors"), use_inactive=True)
        package.swap_constant_buffer()  # folded again from the new weights at the next run
        torch.testing.assert_close(package(x), models[1](x))
        theirs = torch._inductor.aoti_load_package(folding_package())
        report = instanttensor.load_constants(theirs, str(tmp_path / "1.safetensors"),
                                              unchecked=True)
        assert report.constants == ["b", "w"]
        torch.testing.assert_close(theirs(x), models[0](x))
