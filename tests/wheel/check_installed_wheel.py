"""Runs inside a fresh virtual environment that holds torch and the installed wheel, nothing else
(scripts/check_wheel.sh): no compiler, no CMake, no pytest, no liburing on the system where the
check can hide it. Imports instanttensor, writes a checkpoint and loads it back in every mode,
each tensor compared with what was written. Plain asserts: pytest is not installed here.

    python check_installed_wheel.py EXPECTED_VERSION [--liburing-hidden]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch


def check_environment(expected_version: str) -> None:
    for tool in ["cc", "gcc", "g++", "c++", "clang", "cmake", "ninja", "make"]:
        assert shutil.which(tool) is None, f"{tool} is reachable from the wheel's environment"
    import instanttensor

    prefix = os.path.realpath(sys.prefix)
    assert os.path.realpath(instanttensor.__file__).startswith(prefix + os.sep), (
        f"instanttensor imported from {instanttensor.__file__}, not from the venv {prefix}")
    assert instanttensor.__version__ == expected_version, instanttensor.__version__
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert f"+torch{minor}" in instanttensor.__version__, (instanttensor.__version__, minor)
    assert os.path.isfile(os.path.join(instanttensor.cmake_prefix_path, "instanttensor",
                                       "instanttensorConfig.cmake"))
    maps = open("/proc/self/maps").read()
    assert "libinstanttensor.so" in maps
    assert "liburing" not in maps, "a liburing from the system was loaded"


def checkpoint(folder: str) -> tuple[list[str], dict[str, torch.Tensor]]:
    import instanttensor

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "embed.weight": torch.randn(512, 256, generator=generator),
        "layers.0.w": torch.randn(300, 77, generator=generator).to(torch.bfloat16),
        "layers.0.b": torch.arange(77, dtype=torch.int64),
        "layers.1.mask": torch.rand(33, 5, generator=generator) > 0.5,
        "scalar": torch.tensor(3.5, dtype=torch.float16),
    }
    names = sorted(tensors)
    files = []
    for index, part in enumerate([names[:2], names[2:]]):
        path = os.path.join(folder, f"model-{index:05d}.safetensors")
        instanttensor.save_file({name: tensors[name] for name in part}, path,
                                metadata={"format": "pt"})
        files.append(path)
    return files, tensors


def same(tensor: torch.Tensor, expected: torch.Tensor) -> bool:
    return (tensor.dtype == expected.dtype and tensor.shape == expected.shape
            and torch.equal(tensor.view(torch.uint8) if tensor.dim() else tensor,
                            expected.view(torch.uint8) if expected.dim() else expected))


def check_loads(files: list[str], tensors: dict[str, torch.Tensor]) -> list[str]:
    import instanttensor

    checked = []
    for copy in [True, False]:
        for backend in [None, "pread", "uring_buffered", "mmap"]:
            seen = {}
            with instanttensor.safe_open(files, framework="pt", device="cpu", copy=copy,
                                         backend=backend) as f:
                for name, tensor in f.tensors():
                    assert same(tensor, tensors[name]), (copy, backend, name)
                    seen[name] = tensor.clone()
                description = f.stats()["backend"]
            assert seen.keys() == tensors.keys(), (copy, backend, sorted(seen))
            if backend == "uring_buffered":  # the liburing linked into the library
                assert "io_uring" in description, description
            checked.append(f"safe_open copy={copy} backend={backend}: {description}")
    with instanttensor.safe_open(files[1]) as f:
        assert same(f.get_tensor("layers.1.mask"), tensors["layers.1.mask"])
        assert same(f.get_slice("layers.0.w")[10:20], tensors["layers.0.w"][10:20])
    loaded = {}
    for path in files:
        loaded.update(instanttensor.load_file(path))
    assert all(same(loaded[name], tensors[name]) for name in tensors)
    destinations = {name: torch.empty_like(tensor) for name, tensor in tensors.items()}
    instanttensor.load_into(destinations, files)
    assert all(same(destinations[name], tensors[name]) for name in tensors)
    names = sorted(tensors)
    owned = torch.ops.instanttensor.load_tensors(files, names, torch.device("cpu"))
    assert all(same(tensor, tensors[name]) for name, tensor in zip(names, owned))
    import instanttensor.torch as safetensors_face

    data = safetensors_face.save({"x": tensors["embed.weight"]})
    assert same(safetensors_face.load(data)["x"], tensors["embed.weight"])
    checked += ["get_tensor, get_slice", "load_file", "load_into",
                "torch.ops.instanttensor.load_tensors", "instanttensor.torch save/load"]
    return checked


def main() -> None:
    expected_version = sys.argv[1]
    check_environment(expected_version)
    with tempfile.TemporaryDirectory() as folder:
        files, tensors = checkpoint(folder)
        for line in check_loads(files, tensors):
            print("ok:", line)
    liburing_hidden = "--liburing-hidden" in sys.argv
    print(f"the wheel {expected_version} works with torch {torch.__version__} alone"
          + (" (the system's liburing hidden)" if liburing_hidden else ""))


if __name__ == "__main__":
    main()
