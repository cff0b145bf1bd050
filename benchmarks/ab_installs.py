#!/usr/bin/env python3
"""A/B of two installs of instanttensor on one checkpoint: the same loads, interleaved (the order
alternates each round), a fresh process per sample, cold (evicted from the page cache) and warm;
medians and the new/old speed ratio. For checking that a change of the engine costs nothing.

    python -m venv --system-site-packages /tmp/oldenv && /tmp/oldenv/bin/pip install wheel
    git worktree add /tmp/oldsrc REV && (cd /tmp/oldsrc &&
        /tmp/oldenv/bin/pip install --no-build-isolation --ignore-installed --no-deps .)
    python benchmarks/ab_installs.py --old-python /tmp/oldenv/bin/python \\
        --checkpoint /var/tmp/instanttensor-bench-2.0g --samples 5

"new" is the interpreter running this script (its installed instanttensor).

With --simdev-gbps G the samples are device_pipeline.py's own (its worker, a fresh process each)
onto the simulated device with a G GB/s copy engine (40: read-bound, 1: copy-bound), modes
copy, borrow and into; both installs load the one simulated device of the CMake build
(INSTANTTENSOR_CMAKE_BUILD_DIR, default ./build).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import sys, time, json, torch, instanttensor
mode, files = sys.argv[1], sys.argv[2:]
with instanttensor.safe_open(files) as f:
    dest = {n: torch.empty(s, dtype=d) for n in f.keys() for d, s in [f.get_tensor_metadata(n)]}
for t in dest.values():
    t.view(-1).view(torch.uint8).fill_(0)  # pre-faulted: the destination is not measured
start = time.perf_counter()
if mode == "load_into":
    instanttensor.load_into(dest, files)
else:
    with instanttensor.safe_open(files, copy=(mode == "copy")) as f:
        for name, tensor in f.tensors():
            dest[name].copy_(tensor)
print(json.dumps(time.perf_counter() - start))
'''


def evict(files: list[str]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def warm(files: list[str]) -> None:
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def _device_pipeline_sample(python: str, mode: str, cache: str, files: list[str],
                            gbps: float) -> float:
    """One sample of benchmarks/device_pipeline.py onto the simulated device, by `python`."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "device_pipeline.py")
    os.environ.setdefault("INSTANTTENSOR_CMAKE_BUILD_DIR", os.path.join(here, "..", "build"))
    spec = {"mode": mode, "cache": cache, "files": files, "device": "simdev",
            "h2d_gbps": gbps, "d2h_gbps": gbps, "latency_us": 10.0, "options": {}}
    done = subprocess.run([python, script, "--worker", json.dumps(spec)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-python", required=True, help="interpreter of the old install")
    parser.add_argument("--checkpoint", required=True, help="a folder of .safetensors files")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--caches", default="cold,warm")
    parser.add_argument("--modes", default="load_into,copy,borrow")
    parser.add_argument("--simdev-gbps", type=float,
                        help="A/B device_pipeline.py's samples onto the simulated device instead")
    args = parser.parse_args()
    if args.simdev_gbps and args.modes == "load_into,copy,borrow":
        args.modes = "into,copy,borrow"  # device_pipeline.py's names
    files = sorted(glob.glob(os.path.join(args.checkpoint, "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    envs = {"old": args.old_python, "new": sys.executable}
    for cache in args.caches.split(","):
        for mode in args.modes.split(","):
            times: dict[str, list[float]] = {k: [] for k in envs}
            for round_index in range(args.samples):
                order = list(envs) if round_index % 2 == 0 else list(envs)[::-1]
                for name in order:
                    if args.simdev_gbps:  # the worker evicts or warms the files itself
                        times[name].append(_device_pipeline_sample(
                            envs[name], mode, cache, files, args.simdev_gbps))
                        continue
                    evict(files) if cache == "cold" else warm(files)
                    done = subprocess.run([envs[name], "-c", WORKER, mode, *files],
                                          capture_output=True, text=True, cwd="/tmp", check=True)
                    times[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            median = {k: statistics.median(v) for k, v in times.items()}
            spread = {k: f"{total / max(v) / 1e9:.1f}-{total / min(v) / 1e9:.1f}"
                      for k, v in times.items()}
            print(f"{cache:4s} {mode:9s} old {total / median['old'] / 1e9:6.2f} GB/s "
                  f"({spread['old']})  new {total / median['new'] / 1e9:6.2f} GB/s "
                  f"({spread['new']})  new/old {median['old'] / median['new']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
