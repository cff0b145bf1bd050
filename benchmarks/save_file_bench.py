"""save_file's cost of durability: instanttensor.save_file (unnamed file, fsync of the data,
rename, fsync of the folder) against safetensors.torch.save_file (no fsync) on the same tensors,
interleaved, a fresh process per sample, medians.

    python benchmarks/save_file_bench.py [--size-mb 1024] [--samples 3] [--dir /tmp/it-save]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

SAMPLE = """
import sys, time, torch
writer, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
tensors = {f"w{i}": torch.ones(size // 4 // 8) for i in range(8)}
if writer == "instanttensor":
    from instanttensor import save_file
else:
    from safetensors.torch import save_file
start = time.perf_counter()
save_file(tensors, path)
print(time.perf_counter() - start)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/instanttensor-save-bench")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    size = args.size_mb << 20
    times: dict[str, list[float]] = {"instanttensor": [], "safetensors": []}
    for _ in range(args.samples):
        for writer in times:
            path = os.path.join(args.dir, f"{writer}.safetensors")
            out = subprocess.run([sys.executable, "-c", SAMPLE, writer, path, str(size)],
                                 check=True, capture_output=True, text=True).stdout
            times[writer].append(float(out))
            os.remove(path)
    base = statistics.median(times["safetensors"])
    for writer, samples in times.items():
        median = statistics.median(samples)
        print(f"{writer:14s} {args.size_mb} MiB: median {median:.2f} s "
              f"({size / median / 1e9:.2f} GB/s; {median / base:.2f}x safetensors) "
              f"samples {', '.join(f'{t:.2f}' for t in samples)}")


if __name__ == "__main__":
    main()
