"""A checkpoint larger than the machine's memory, read cold by a consumer that copies each tensor
and drops it: load rate and peak resident memory, instanttensor copy=True against safetensors and
the read ceiling (buffered sequential reads of the same files, each dropped from the cache after).
Not a test. Each sample runs in a fresh process after the files are evicted from the page cache;
contenders alternate, medians are reported.

    python benchmarks/larger_than_ram.py [--checkpoint DIR | --size-gb 30 --dir DIR]
                                         [--samples 2] [--working-set-gb 3] [--json FILE]

`--working-set-gb N`: before each sample, a file of N GB (written once beside the checkpoint's
folder) is read three times, as a working set the system uses often; after the sample, the share
of it still in the page cache is reported. A load that promotes the pages it reads once pushes
the working set out.

The consumer copies every tensor into one reused buffer (a model's loader writes into its
parameters, which are not what is measured), so resident memory above the process's baseline is
the loader's: its buffers, and the file pages its tensors keep mapped. Peak RSS is the process's
VmHWM (file pages mapped count); `baseline MB` is the same process's RSS before the load.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

SAMPLE = r"""
import json, sys, time, torch
kind, files = sys.argv[1], sys.argv[2:]
def status_mb(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
sink = torch.empty(0, dtype=torch.uint8)
def consume(tensor):
    global sink
    flat = tensor.reshape(-1).view(torch.uint8)
    if sink.numel() < flat.numel():
        sink = torch.empty(flat.numel(), dtype=torch.uint8)
    sink[: flat.numel()].copy_(flat)
    return flat.numel()
consume(torch.ones(1 << 20))  # the copy kernel warmed, its buffer faulted before the baseline
baseline = status_mb("VmRSS")
start = time.perf_counter()
total = 0
if kind == "read":  # the ceiling: buffered sequential reads of the same bytes, no tensors
    import os
    chunk = bytearray(64 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while (got := f.readinto(chunk)) > 0:
                total += got
        fd = os.open(path, os.O_RDONLY)  # keep the page cache as cold for the next file
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
elif kind == "safetensors":
    from safetensors import safe_open
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                total += consume(f.get_tensor(name))
else:
    from instanttensor import safe_open
    with safe_open(files, copy=True) as f:
        for name, tensor in f.tensors():
            total += consume(tensor)
seconds = time.perf_counter() - start
# VmHWM, not getrusage's ru_maxrss: exec folds the forking parent's peak into the latter.
peak = status_mb("VmHWM")
print(json.dumps({"seconds": seconds, "bytes": total, "peak_mb": peak, "baseline_mb": baseline}))
"""

CONTENDERS = ["instanttensor", "safetensors", "read"]


def evict(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def write_shards(folder: str, size_gb: float, shard_gb: float = 4.0) -> list[str]:
    """Model-like shards (4096-wide bf16 matrices, a 262 MB head in the last), written one at a
    time so that no more than one shard is ever in memory (the package's generator holds every
    shard at once, which a checkpoint larger than memory cannot)."""
    import torch

    from instanttensor import save_file

    os.makedirs(folder, exist_ok=True)
    hidden, vocab = 4096, 32000
    matrix = hidden * hidden * 2
    shards = max(1, round(size_gb / shard_gb))
    per_shard = int(size_gb * 1e9 / shards) // matrix
    paths = []
    for index in range(shards):
        shard = {}
        for row in range(per_shard):
            # A cheap fill that differs per tensor (random numbers would take minutes).
            shard[f"model.layers.{index}.{row}.weight"] = torch.full(
                (hidden, hidden), float(index * per_shard + row), dtype=torch.bfloat16)
        if index == shards - 1:
            shard["lm_head.weight"] = torch.full((vocab, hidden), -1.0, dtype=torch.bfloat16)
        path = os.path.join(folder, f"model-{index + 1:05d}-of-{shards:05d}.safetensors")
        save_file(shard, path)
        paths.append(path)
        del shard
    return paths


def checkpoint_files(args: argparse.Namespace) -> list[str]:
    folder = args.checkpoint or os.path.join(args.dir, f"ckpt-{args.size_gb:g}g")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        files = write_shards(folder, args.size_gb)
    return sorted(files)


def working_set(folder: str, size_gb: float) -> str:
    """A file of `size_gb` GiB (whole MiB, at least one) of random bytes beside `folder`, written
    once."""
    path = os.path.join(os.path.dirname(os.path.abspath(folder)), f"working-set-{size_gb:g}g.bin")
    mib = max(1, round(size_gb * 1024))
    if not os.path.exists(path) or os.path.getsize(path) != mib << 20:
        with open(path, "wb") as out:
            for _ in range(mib):
                out.write(os.urandom(1 << 20))
    return path


def use_often(path: str) -> None:
    """Reads `path` three times: its pages are then on the kernel's active list."""
    for _ in range(3):
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def memory_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        return int(meminfo.readline().split()[1]) / 1024 / 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default=None, help="a folder of .safetensors")
    parser.add_argument("--size-gb", type=float, default=30.0)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--working-set-gb", type=float, default=0.0,
                        help="report how much of a file read often before each sample stays cached")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    files = checkpoint_files(args)
    busy = working_set(os.path.dirname(files[0]), args.working_set_gb) if args.working_set_gb else None
    if busy:
        from instanttensor._demo_bench import resident_fraction
    size_gb = sum(os.path.getsize(p) for p in files) / 1e9
    print(f"{len(files)} files, {size_gb:.1f} GB; memory {memory_gb():.1f} GiB")
    results: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for round_index in range(args.samples):
        shift = round_index % len(CONTENDERS)
        order = CONTENDERS[shift:] + CONTENDERS[:shift]
        for name in order:
            evict(files)
            if busy:
                use_often(busy)
            done = subprocess.run([sys.executable, "-c", SAMPLE, name, *files],
                                  capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
            sample = json.loads(done.stdout.strip().splitlines()[-1])
            kept = ""
            if busy:
                sample["working_set_cached"] = resident_fraction(busy)
                kept = f", working set still cached {sample['working_set_cached']:.0%}"
            results[name].append(sample)
            print(f"  {name}: {sample['seconds']:.1f} s, {sample['bytes'] / sample['seconds'] / 1e9:.2f}"
                  f" GB/s, peak RSS {sample['peak_mb']:.0f} MB (baseline {sample['baseline_mb']:.0f})"
                  f"{kept}", flush=True)
    print(f"{'contender':<14} {'seconds':>8} {'GB/s':>6} {'peak RSS MB':>12} {'above baseline MB':>18}")
    table = {}
    for name, samples in results.items():
        seconds = statistics.median(s["seconds"] for s in samples)
        peak = statistics.median(s["peak_mb"] for s in samples)
        above = statistics.median(s["peak_mb"] - s["baseline_mb"] for s in samples)
        rate = samples[0]["bytes"] / seconds / 1e9
        table[name] = {"seconds": seconds, "gb_per_s": rate, "peak_rss_mb": peak,
                       "above_baseline_mb": above, "samples": samples}
        kept = ""
        if busy:
            table[name]["working_set_cached"] = statistics.median(
                s["working_set_cached"] for s in samples)
            kept = f"  working set still cached {table[name]['working_set_cached']:.0%}"
        print(f"{name:<14} {seconds:>8.1f} {rate:>6.2f} {peak:>12.0f} {above:>18.0f}{kept}")
    ratio = table["safetensors"]["seconds"] / table["instanttensor"]["seconds"]
    ceiling = table["read"]["seconds"] / table["instanttensor"]["seconds"]
    print(f"instanttensor speed x safetensors: {ratio:.2f}; x the read ceiling: {ceiling:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"files": len(files), "gb": size_gb, "memory_gib": memory_gb(),
                       "results": table, "speed_x_safetensors": ratio,
                       "speed_x_read_ceiling": ceiling}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
