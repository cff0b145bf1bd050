#!/usr/bin/env python3
"""What a fork costs after loading a checkpoint and keeping its tensors, beside safetensors: a
fresh process per sample loads the checkpoint with `load_file` (tensors kept, the load timed),
then forks a child that reads one byte of each tensor and exits; the parent's fork() time and the
growth of its anonymous memory (/proc/self/smaps_rollup) around the fork are measured. Samples
interleave the loaders; medians are printed. `--lease-refused`: each sample holds the file open
for writing first, so the kernel refuses read leases (NFS, another user's files) and our kept
views are copied where they are (README, copy=True).

    python benchmarks/fork_bench.py --size-gb 1 --samples 5 [--lease-refused] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SAMPLE = r"""
import json, os, sys, time
loader, path, refuse = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
held_for_writing = open(path, "r+b") if refuse else None  # no read lease while it is open
if loader == "instanttensor":
    from instanttensor.torch import load_file
else:
    from safetensors.torch import load_file

def anonymous_kb():
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])

start = time.perf_counter()
kept = load_file(path)
load_seconds = time.perf_counter() - start
before = anonymous_kb()
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    ok = all(t.view(-1)[:1].numel() == 1 for t in kept.values())
    os._exit(0 if ok else 1)
fork_seconds = time.perf_counter() - start
grown_kb = anonymous_kb() - before
_, status = os.waitpid(pid, 0)
print(json.dumps({"load_seconds": load_seconds, "fork_seconds": fork_seconds,
                  "anonymous_mb": grown_kb / 1024, "child_status": status}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where the checkpoint is written")
    parser.add_argument("--json", default=None, help="write the samples here")
    parser.add_argument("--lease-refused", action="store_true",
                        help="hold the file open for writing: read leases refused")
    args = parser.parse_args()
    from instanttensor._demo_checkpoint import write_model_like_checkpoint

    folder = args.folder or tempfile.mkdtemp(prefix="fork-bench-", dir="/var/tmp")
    path = list(write_model_like_checkpoint(folder, total_mb=int(args.size_gb * 1024), files=1,
                                            hidden=4096, vocab=32000))[0]
    loaders = ["instanttensor", "safetensors"]
    samples: dict[str, list[dict]] = {name: [] for name in loaders}
    for _ in range(args.samples):
        for name in loaders:  # interleaved, a fresh process each
            refuse = "1" if args.lease_refused else "0"
            out = subprocess.run([sys.executable, "-c", SAMPLE, name, path, refuse], check=True,
                                 capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            assert result["child_status"] == 0, result
            samples[name].append(result)
    size_gb = os.path.getsize(path) / 1e9
    leases = "read leases refused" if args.lease_refused else "read leases granted where they can"
    print(f"fork after load_file of {size_gb:.2f} GB, tensors kept ({leases}); medians of "
          f"{args.samples} fresh processes, interleaved")
    print(f"{'loader':<14} {'load_file s':>12} {'fork() s':>10} {'parent anon +MB':>16}")
    medians = {}
    for name in loaders:
        medians[name] = [statistics.median(s[key] for s in samples[name])
                         for key in ("load_seconds", "fork_seconds", "anonymous_mb")]
        load, fork, grown = medians[name]
        print(f"{name:<14} {load:>12.4f} {fork:>10.4f} {grown:>16.1f}")
    for index, what in ((0, "load_file time"), (1, "fork time")):
        ratio = medians["instanttensor"][index] / max(medians["safetensors"][index], 1e-9)
        print(f"{what}, instanttensor / safetensors: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"size_gb": size_gb, "lease_refused": args.lease_refused,
                       "samples": samples}, out, indent=1)


if __name__ == "__main__":
    main()
