#!/usr/bin/env python3
"""Loads a checkpoint onto a GPU with every contender and the ceilings, in one run.

    python benchmarks/device_bench.py OUT_DIR [--size-gb 3] [--samples 3]

Checkpoints: the same synthetic model in tmpfs (/dev/shm) and on disk (/var/tmp). Contenders:
instanttensor copy=True / copy=False, safetensors (device="cuda"), upstream InstantTensor and
fastsafetensors when importable. Ceilings measured in the same run: pinned host-to-device copy
bandwidth (the tmpfs ceiling) and an O_DIRECT read of the files (the disk ceiling). Workload:
copy every tensor into a preallocated device tensor. Also checks every byte against a plain
host load. Writes a table (stdout and OUT_DIR/device_bench.txt) and OUT_DIR/device_bench.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import time

import torch


def contenders():
    import instanttensor

    def ours(copy):
        def run(files, dest):
            with instanttensor.safe_open(files, device="cuda", copy=copy) as f:
                for name, tensor in f.tensors():
                    dest[name].copy_(tensor)
        return run

    def safetensors_cuda(files, dest):
        from safetensors import safe_open

        for path in files:
            with safe_open(path, framework="pt", device="cuda") as f:
                for name in f.keys():
                    dest[name].copy_(f.get_tensor(name))

    result = {"instanttensor copy=True": ours(True), "instanttensor copy=False": ours(False),
              "safetensors device=cuda": safetensors_cuda}
    try:
        from fastsafetensors import fastsafe_open

        def fast(files, dest):
            with fastsafe_open(files, framework="pt", device="cuda:0", nogds=True) as f:
                for name in f.keys():
                    dest[name].copy_(f.get_tensor(name))
        result["fastsafetensors"] = fast
    except Exception as error:  # noqa: BLE001
        print(f"fastsafetensors: not importable ({error})")
    upstream = os.environ.get("UPSTREAM_INSTANTTENSOR_PATH")
    if upstream:  # the upstream wheel unpacked somewhere; same package name as ours
        def upstream_run(files, dest):
            sys.path.insert(0, upstream)
            try:
                import importlib

                module = importlib.import_module("instanttensor")
                with module.safe_open(files, framework="pt", device=0) as f:
                    for name, tensor in f.tensors():
                        dest[name].copy_(tensor)
            finally:
                sys.path.remove(upstream)
        result["upstream InstantTensor"] = upstream_run
    return result


def pinned_h2d_gbps(nbytes: int) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return 3 * nbytes / (time.perf_counter() - start) / 1e9


def direct_read_gbps(files) -> float:
    import mmap

    buffer = mmap.mmap(-1, 16 << 20)
    start = time.perf_counter()
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        offset = 0
        while True:
            n = os.preadv(fd, [buffer], offset)
            if n <= 0:
                break
            offset += n
            total += n
        os.close(fd)
    return total / (time.perf_counter() - start) / 1e9


def evict(files) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--size-gb", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from instanttensor import safe_open
    from instanttensor._demo_checkpoint import write_model_like_checkpoint

    disk = "/var/tmp/instanttensor-device-bench"
    if not glob.glob(os.path.join(disk, "*.safetensors")):
        write_model_like_checkpoint(disk, total_mb=int(args.size_gb * 1024), files=4,
                                    hidden=4096, vocab=32000)
    disk_files = sorted(glob.glob(os.path.join(disk, "*.safetensors")))
    shm = "/dev/shm/instanttensor-device-bench"
    os.makedirs(shm, exist_ok=True)
    for path in disk_files:
        target = os.path.join(shm, os.path.basename(path))
        if not os.path.exists(target):
            shutil.copy(path, target)
    shm_files = sorted(glob.glob(os.path.join(shm, "*.safetensors")))
    total = sum(os.path.getsize(p) for p in disk_files)

    with safe_open(disk_files) as f:
        reference = {n: t for n, t in f.tensors()}
    dest = {n: torch.empty_like(t, device="cuda") for n, t in reference.items()}
    runs = contenders()
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "bytes": total,
               "ceilings": {"pinned H2D GB/s": pinned_h2d_gbps(1 << 30),
                            "O_DIRECT read GB/s": direct_read_gbps(disk_files)},
               "tmpfs": {}, "disk": {}, "correct": {}}
    for where, files in (("tmpfs", shm_files), ("disk", disk_files)):
        for name in runs:
            results[where][name] = []
        for _ in range(args.samples):
            for name, run in runs.items():
                if where == "disk":
                    evict(files)
                torch.cuda.synchronize()
                start = time.perf_counter()
                try:
                    run(files, dest)
                    torch.cuda.synchronize()
                    results[where][name].append(time.perf_counter() - start)
                except Exception as error:  # noqa: BLE001 - reported in the table
                    results[where][name] = f"error: {error}"[:200]
                    continue
                if name.startswith("instanttensor"):
                    results["correct"][name] = all(
                        torch.equal(dest[n].cpu().view(torch.uint8) if dest[n].dtype == torch.bool
                                    else dest[n].cpu(), reference[n]) for n in reference)
    lines = [f"{results['gpu']}, torch {results['torch']}, {total / 1e9:.2f} GB",
             f"ceilings: pinned H2D {results['ceilings']['pinned H2D GB/s']:.1f} GB/s, "
             f"O_DIRECT read {results['ceilings']['O_DIRECT read GB/s']:.1f} GB/s"]
    for where, ceiling in (("tmpfs", "pinned H2D GB/s"), ("disk", "O_DIRECT read GB/s")):
        lines.append(f"{where}:")
        for name, samples in results[where].items():
            if isinstance(samples, str) or not samples:
                lines.append(f"  {name:28s} {samples}")
                continue
            gbps = total / statistics.median(samples) / 1e9
            lines.append(f"  {name:28s} {gbps:6.2f} GB/s  x ceiling "
                         f"{gbps / results['ceilings'][ceiling]:.2f}")
    lines.append(f"byte-exact: {results['correct']}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "device_bench.txt"), "w") as out:
        out.write(text + "\n")
    with open(os.path.join(args.out, "device_bench.json"), "w") as out:
        json.dump(results, out, indent=2)
    return 0 if all(results["correct"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
