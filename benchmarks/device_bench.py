#!/usr/bin/env python3
"""Loads a checkpoint onto a GPU with every contender and the ceilings, in one run.

    python3 benchmarks/device_bench.py OUT_DIR [--size-gb 3] [--samples 3]

Checkpoints: the same synthetic model on disk (/var/tmp) and, when /dev/shm has room, in tmpfs.
Contenders: instanttensor copy=True / copy=False, safetensors (device="cuda"), fastsafetensors
and upstream InstantTensor (UPSTREAM_INSTANTTENSOR_PATH) when importable. Ceilings measured in
the same run: pinned host-to-device copies (tmpfs) and O_DIRECT reads of the files (disk).
Workload: copy every tensor into a preallocated device tensor, zeroed before each sample.

Nothing can pass by accident: every sample of every contender is checked byte for byte against
the reference (safetensors on the CPU), a contender that raises or leaves a destination
untouched is a failure, and the exit status is non-zero when any instanttensor sample failed.
Also measured: pinned host memory and device memory held after our loaders closed, and a
2-process load on the one GPU over a gloo group (CUDA tensors), byte-checked, against 1 process.
Writes OUT_DIR/device_bench.txt and OUT_DIR/device_bench.json.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def contenders() -> dict:
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

    def ours_into(files, dest):  # straight into the CUDA destinations through pinned staging
        instanttensor.load_into(dest, files)

    result = {"instanttensor copy=True": ours(True), "instanttensor copy=False": ours(False),
              "instanttensor load_into": ours_into, "safetensors device=cuda": safetensors_cuda}
    try:
        from fastsafetensors import fastsafe_open

        def fast(files, dest):
            with fastsafe_open(files, framework="pt", device="cuda:0", nogds=True) as f:
                for name in f.keys():
                    dest[name].copy_(f.get_tensor(name))
        result["fastsafetensors"] = fast
    except Exception as error:  # noqa: BLE001 - said in the output
        print(f"fastsafetensors: not importable ({error})")
    upstream = os.environ.get("UPSTREAM_INSTANTTENSOR_PATH")
    if upstream:  # the upstream wheel unpacked somewhere; same package name as ours
        def upstream_run(files, dest):
            import importlib

            saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "instanttensor"}
            for key in saved:
                del sys.modules[key]
            sys.path.insert(0, upstream)
            try:
                module = importlib.import_module("instanttensor")
                with module.safe_open(files, framework="pt", device=0) as f:
                    for name, tensor in f.tensors():
                        dest[name].copy_(tensor)
            finally:
                sys.path.remove(upstream)
                for key in [k for k in sys.modules if k.split(".")[0] == "instanttensor"]:
                    del sys.modules[key]
                sys.modules.update(saved)
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
    seconds = time.perf_counter() - start
    return 3 * nbytes / seconds / 1e9


def direct_read_gbps(files) -> float | str:
    """Sequential O_DIRECT reads, 16 MiB each; the reason when the filesystem refuses them."""
    import mmap

    buffer = mmap.mmap(-1, 16 << 20)
    start = time.perf_counter()
    total = 0
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as error:
            return f"O_DIRECT refused ({error.strerror}): skipped"
        try:
            offset = 0
            while True:
                try:
                    n = os.preadv(fd, [buffer], offset)
                except OSError as error:
                    return f"O_DIRECT read refused ({error.strerror}): skipped"
                if n <= 0:
                    break
                offset += n
                total += n
        finally:
            os.close(fd)
    return total / (time.perf_counter() - start) / 1e9


def evict(files) -> float:
    """Dirty pages written first, then dropped; returns the largest residency left."""
    from instanttensor._demo_bench import evict as drop

    os.sync()
    return drop(files)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(-1).view(torch.uint8)


def same(dest: dict, reference: dict) -> bool:
    return all(torch.equal(as_bytes(dest[n]), reference[n]) for n in reference)


def place_checkpoint(size_gb: float) -> tuple[list[str], list[str] | str]:
    from instanttensor._demo_checkpoint import write_model_like_checkpoint

    disk = "/var/tmp/instanttensor-device-bench"
    marker = os.path.join(disk, f".complete-{size_gb}")
    if not os.path.exists(marker):
        shutil.rmtree(disk, ignore_errors=True)
        write_model_like_checkpoint(disk, total_mb=int(size_gb * 1024), files=4, hidden=4096,
                                    vocab=32000)
        open(marker, "w").close()
    disk_files = sorted(glob.glob(os.path.join(disk, "*.safetensors")))
    total = sum(os.path.getsize(p) for p in disk_files)
    shm = "/dev/shm/instanttensor-device-bench"
    free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    present = sum(os.path.getsize(p) for p in glob.glob(os.path.join(shm, "*.safetensors")))
    if present != total and free < total * 1.05 + (64 << 20):
        return disk_files, f"skipped: /dev/shm has {free / 1e9:.1f} GB free, needs {total / 1e9:.1f}"
    os.makedirs(shm, exist_ok=True)
    for path in disk_files:
        target = os.path.join(shm, os.path.basename(path))
        if not os.path.exists(target) or os.path.getsize(target) != os.path.getsize(path):
            shutil.copy(path, target)
    return disk_files, sorted(glob.glob(os.path.join(shm, "*.safetensors")))


RANK_SCRIPT = r"""
import hashlib, json, sys, time, torch, torch.distributed as dist, instanttensor
rank, world, store, files, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
torch.cuda.set_device(0)
if world > 1:
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    dist.barrier()
start = time.perf_counter()
digests = {}
with instanttensor.safe_open(files, device="cuda:0", copy=True,
                             process_group=dist.group.WORLD if world > 1 else None) as f:
    kept = list(f.tensors())
    stats = f.stats()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
for name, tensor in kept:
    digests[name] = hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
json.dump({"seconds": seconds, "digests": digests, "bytes_read": stats["bytes_read"]}, open(out, "w"))
if world > 1:
    dist.destroy_process_group()
"""


def distributed_check(files: list[str], reference: dict) -> dict:
    """1 process, then 2 processes sharing the one GPU over gloo (NCCL needs a GPU per rank)."""
    expected = {n: hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest() for n, t in reference.items()}
    result = {}
    for world in (1, 2):
        folder = tempfile.mkdtemp()
        outs = [os.path.join(folder, f"rank{r}.json") for r in range(world)]
        procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r), str(world),
                                   os.path.join(folder, "store"), json.dumps(files), outs[r]],
                                  stderr=subprocess.PIPE, text=True) for r in range(world)]
        errors = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                errors.append("timed out")
                continue
            if proc.returncode != 0:
                errors.append((err.strip().splitlines() or ["failed"])[-1][:200])
        if errors:
            result[f"{world} rank(s)"] = {"error": "; ".join(errors)}
            continue
        ranks = [json.load(open(o)) for o in outs]
        result[f"{world} rank(s)"] = {
            "seconds": max(r["seconds"] for r in ranks),
            "byte_exact": all(r["digests"] == expected for r in ranks),
            "share_read": [r["bytes_read"] / sum(t.numel() for t in reference.values())
                           for r in ranks]}
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--size-gb", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from safetensors.torch import load_file

    disk_files, shm_files = place_checkpoint(args.size_gb)
    total = sum(os.path.getsize(p) for p in disk_files)
    reference = {}
    for path in disk_files:
        reference.update({n: as_bytes(t).cuda() for n, t in load_file(path).items()})
    dest = {}
    for path in disk_files:
        dest.update({n: torch.empty_like(t, device="cuda") for n, t in load_file(path).items()})
    runs = contenders()
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "bytes": total,
               "ceilings": {"pinned H2D GB/s": pinned_h2d_gbps(1 << 30),
                            "O_DIRECT read GB/s": direct_read_gbps(disk_files)},
               "tmpfs": {}, "disk": {}, "failures": [], "held_after_close": {}}
    places = [("disk", disk_files)]
    if isinstance(shm_files, list):
        places.insert(0, ("tmpfs", shm_files))
    else:
        results["tmpfs"] = shm_files
    for where, files in places:
        table = {name: {"seconds": []} for name in runs}
        for _ in range(args.samples):
            for name, run in runs.items():
                row = table[name]
                if "error" in row:
                    continue
                for tensor in dest.values():
                    as_bytes(tensor).zero_()
                if where == "disk":
                    row["residency_before"] = evict(files)
                torch.cuda.synchronize()
                device_before = torch.cuda.memory_allocated()
                start = time.perf_counter()
                try:
                    run(files, dest)
                    torch.cuda.synchronize()
                except Exception as error:  # noqa: BLE001 - a failure, recorded
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    results["failures"].append(f"{where} {name}: {row['error']}")
                    continue
                row["seconds"].append(time.perf_counter() - start)
                if not same(dest, reference):
                    row["error"] = "wrong or missing bytes"
                    results["failures"].append(f"{where} {name}: wrong or missing bytes")
                if name.startswith("instanttensor"):
                    # Pinned: all of the process's (our ring goes back to the system at close).
                    results["held_after_close"][name] = {
                        "pinned bytes": torch.cuda.host_memory_stats().get(
                            "allocated_bytes.current", 0),
                        "device bytes": torch.cuda.memory_allocated() - device_before}
        results[where] = table
    results["distributed"] = distributed_check(
        shm_files if isinstance(shm_files, list) else disk_files,
        {n: t.cpu() for n, t in reference.items()})

    ceilings = results["ceilings"]
    direct = ceilings["O_DIRECT read GB/s"]
    lines = [f"{results['gpu']}, torch {results['torch']}, {total / 1e9:.2f} GB",
             f"ceilings: pinned H2D {ceilings['pinned H2D GB/s']:.1f} GB/s, O_DIRECT read "
             + (f"{direct:.1f} GB/s" if isinstance(direct, float) else direct)]
    for where, ceiling in (("tmpfs", ceilings["pinned H2D GB/s"]), ("disk", direct)):
        table = results[where]
        if isinstance(table, str):
            lines.append(f"{where}: {table}")
            continue
        lines.append(f"{where}:")
        best_peer = max((total / statistics.median(r["seconds"]) / 1e9 for n, r in table.items()
                         if r["seconds"] and "error" not in r and not n.startswith("instanttensor")),
                        default=None)
        for name, row in table.items():
            if "error" in row or not row["seconds"]:
                lines.append(f"  {name:28s} FAILED: {row.get('error', 'no sample')}")
                continue
            gbps = total / statistics.median(row["seconds"]) / 1e9
            row["gb_per_s"] = gbps
            vs_ceiling = f"x ceiling {gbps / ceiling:.2f}" if isinstance(ceiling, float) else ""
            vs_peer = f"x best peer {gbps / best_peer:.2f}" if best_peer else ""
            lines.append(f"  {name:28s} {gbps:6.2f} GB/s  {vs_ceiling}  {vs_peer}")
    for name, held in results["held_after_close"].items():
        lines.append(f"held after close, {name}: pinned {held['pinned bytes']} B, device "
                     f"{held['device bytes']} B")
    for world, row in results["distributed"].items():
        if "error" in row:
            lines.append(f"distributed {world}: FAILED: {row['error']}")
            results["failures"].append(f"distributed {world}: {row['error']}")
            continue
        lines.append(f"distributed {world}: {row['seconds']:.2f} s, byte-exact {row['byte_exact']}, "
                     f"share read {', '.join(f'{s:.2f}' for s in row['share_read'])}")
        if not row["byte_exact"]:
            results["failures"].append(f"distributed {world}: wrong bytes")
    ours_failed = [f for f in results["failures"] if "instanttensor" in f or "distributed" in f]
    lines.append("RESULT: " + ("FAILED: " + "; ".join(ours_failed) if ours_failed else "ok"))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "device_bench.txt"), "w") as out:
        out.write(text + "\n")
    with open(os.path.join(args.out, "device_bench.json"), "w") as out:
        json.dump(results, out, indent=2, default=str)
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
