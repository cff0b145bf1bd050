"""What an owned copy costs beside the consumer's own copy: one tensor's bytes copied from a
file mapping into fresh memory (what copy=True's owned last tensor, or a materialized view,
pays) against into memory faulted beforehand (what a consumer copying into its parameters
pays), in one process and in N processes at once (ranks of one host). Interleaved, a fresh
process per sample, medians. No instanttensor inside: it measures the machine.

    python benchmarks/fresh_memory.py FILE [--size-mb 256] [--processes 2] [--samples 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SAMPLE = """
import json, mmap, sys, time, warnings, torch
warnings.filterwarnings("ignore")
kind, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "rb") as f:
    mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
source = torch.frombuffer(mapped, dtype=torch.uint8)[:size]
if kind == "faulted":
    dest = torch.empty(size, dtype=torch.uint8)
    dest.fill_(0)
start = time.perf_counter()
if kind == "fresh":
    dest = source.clone()
else:
    dest.copy_(source)
print(json.dumps(time.perf_counter() - start))
"""


def sample(kind: str, path: str, size: int, processes: int) -> float:
    """The slowest of `processes` copies started together (the ranks wait for the last)."""
    runs = [subprocess.Popen([sys.executable, "-c", SAMPLE, kind, path, str(size)],
                             stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    return max(json.loads(run.communicate()[0]) for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a file of at least --size-mb (read warm: run once first)")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    size = args.size_mb << 20
    cells = [(kind, n) for n in (1, args.processes) for kind in ("faulted", "fresh")]
    times: dict = {cell: [] for cell in cells}
    sample("faulted", args.file, size, 1)  # the file into the page cache
    for round_ in range(args.samples):
        for cell in (cells if round_ % 2 == 0 else cells[::-1]):
            times[cell].append(sample(cell[0], args.file, size, cell[1]))
    print(f"{args.size_mb} MiB from a warm mapping, median of {args.samples} (slowest process):")
    for kind, n in cells:
        seconds = statistics.median(times[(kind, n)])
        print(f"  into {kind:8} memory, {n} process(es): {seconds:.3f} s "
              f"({args.size_mb / 1024 / seconds:.2f} GB/s)")


if __name__ == "__main__":
    main()
