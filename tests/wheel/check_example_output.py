"""The C++ example built against the wheel's CMake files (scripts/check_wheel.sh) links the
wheel's library and reads the bytes a checkpoint was written with, iterating and with --into.

    python check_example_output.py EXAMPLE_BINARY VENV
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch

import instanttensor


def fnv1a(data: bytes) -> str:
    value = 1469598103934665603
    for byte in data:
        value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:x}"


def main() -> None:
    binary, venv = sys.argv[1], os.path.realpath(sys.argv[2])
    linked = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    line = next(line for line in linked.splitlines() if "libinstanttensor.so" in line)
    assert os.path.realpath(line.split("=>")[1].split("(")[0].strip()).startswith(venv), line
    tensors = {"a.weight": torch.randn(64, 33), "b.bias": torch.arange(10, dtype=torch.int32),
               "c": torch.randn(7, 3).to(torch.bfloat16)}
    # numpy is not in the venv: the bytes through a list of uint8.
    expected = {name: fnv1a(bytes(t.contiguous().view(-1).view(torch.uint8).tolist()))
                for name, t in tensors.items()}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        instanttensor.save_file(tensors, path)
        for flags in [[], ["--into"]]:
            output = subprocess.run([binary, *flags, path], check=True, capture_output=True,
                                    text=True).stdout
            sums = {line.split()[0]: line.rsplit("fnv1a=", 1)[1] for line in output.splitlines()}
            assert sums == expected, (flags, sums, expected)
    print(f"the C++ example links {line.split('=>')[1].split('(')[0].strip()} and reads every "
          "byte, iterating and --into")


if __name__ == "__main__":
    main()
