"""A C++ program outside the repo, built only against the installed headers and library,
loads a checkpoint written by the reference safetensors package and gets identical bytes."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from safetensors.torch import save_file as reference_save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fnv1a(data: bytes) -> int:
    value = 1469598103934665603
    for byte in data:
        value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return value


@pytest.fixture(scope="module")
def installed_prefix(tmp_path_factory):
    """Installs the CMake build named by INSTANTTENSOR_CMAKE_BUILD_DIR (the test command's), or
    configures and builds one, into a fresh prefix."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is required for the C++ consumer check")
    prefix = tmp_path_factory.mktemp("prefix")
    build = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")
    if not build:
        build = str(tmp_path_factory.mktemp("build"))
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DINSTANTTENSOR_BUILD_TESTS=OFF",
                        "-DINSTANTTENSOR_BUILD_EXAMPLES=OFF"], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", build, "-j", "2"], check=True, capture_output=True)
    subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)], check=True,
                   capture_output=True)
    return prefix


@pytest.fixture(scope="module")
def examples_build(installed_prefix, tmp_path_factory):
    """examples/ copied away from the repo and built against the installed prefix alone."""
    example_src = tmp_path_factory.mktemp("example")
    shutil.copytree(os.path.join(ROOT, "examples"), example_src, dirs_exist_ok=True)
    build = tmp_path_factory.mktemp("example-build")
    prefix_path = f"{installed_prefix};{torch.utils.cmake_prefix_path}"
    configure = subprocess.run(["cmake", "-S", str(example_src), "-B", str(build),
                                f"-DCMAKE_PREFIX_PATH={prefix_path}"], capture_output=True,
                               text=True)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return build


def test_installed_library_serves_an_outside_program(installed_prefix, examples_build, tmp_path):
    build = examples_build

    torch.manual_seed(1)
    tensors = {"embed": torch.randn(32, 16).to(torch.bfloat16), "bias": torch.randn(7),
               "ids": torch.arange(9), "scale": torch.tensor(0.5, dtype=torch.float64)}
    path = str(tmp_path / "reference.safetensors")
    reference_save(tensors, path)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(installed_prefix / "lib"), os.path.join(os.path.dirname(torch.__file__), "lib")])
    run = subprocess.run([str(build / "load_checkpoint"), path], capture_output=True, text=True,
                         env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines()}
    assert set(lines) == set(tensors)
    for name, tensor in tensors.items():
        data = bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy())
        assert lines[name].endswith(f"fnv1a={fnv1a(data):x}"), (name, lines[name])

    into = subprocess.run([str(build / "load_checkpoint"), "--into", path], capture_output=True,
                          text=True, env=env, timeout=60)  # SafeOpen::load_into
    assert into.returncode == 0, into.stderr
    assert sorted(into.stdout.splitlines()) == sorted(run.stdout.splitlines())

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x02\x00")
    failed = subprocess.run([str(build / "load_checkpoint"), str(bad)], capture_output=True,
                            text=True, env=env, timeout=60)
    assert failed.returncode == 1 and str(bad) in failed.stderr


def test_the_aoti_example_serves_a_package_with_the_checkpoints_weights(installed_prefix,
                                                                       examples_build, tmp_path):
    """examples/aoti_inference.cpp, built outside the repo: outputs equal eager with the
    checkpoint's weights, then with the next checkpoint's after a swap while serving."""
    from aoti_model import EXAMPLE_SHAPE, block, packages, weights

    free, inside = packages()
    build = examples_build

    first, second = block(3), block(4)
    paths = {name: str(tmp_path / f"{name}.safetensors") for name in
             ("first", "second", "inputs", "outputs")}
    reference_save(weights(first), paths["first"])
    reference_save(weights(second), paths["second"])
    torch.manual_seed(5)
    x = torch.randn(*EXAMPLE_SHAPE)
    reference_save({"x": x}, paths["inputs"])
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(installed_prefix / "lib"), os.path.join(os.path.dirname(torch.__file__), "lib")])
    app = str(build / "aoti_inference")

    run = subprocess.run([app, free, paths["first"], paths["inputs"], paths["outputs"]],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "loaded 10 constants" in run.stdout
    with torch.no_grad():
        torch.testing.assert_close(load_file(paths["outputs"])["output0"], first(x))

    swap = subprocess.run([app, free, paths["first"], paths["inputs"], paths["outputs"],
                           "--swap", paths["second"]], capture_output=True, text=True, env=env,
                          timeout=120)
    assert swap.returncode == 0, swap.stderr
    assert f"swapped in {paths['second']}" in swap.stdout
    with torch.no_grad():
        torch.testing.assert_close(load_file(paths["outputs"])["output0"], second(x))

    refused = subprocess.run([app, inside, paths["first"], paths["inputs"]], capture_output=True,
                             text=True, env=env, timeout=120)
    assert refused.returncode == 1 and "package_constants_in_so" in refused.stderr
