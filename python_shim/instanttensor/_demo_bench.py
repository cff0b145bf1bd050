"""The demo's side-by-side load comparison, small enough to ship in the package
(`python -m instanttensor` and `python -m instanttensor bench`): instanttensor's paths and
safetensors, cold and warm, one fresh process per sample, interleaved, medians. The full harness
(peers, physical ceilings, ranks, scenarios) is benchmarks/bench.py in the repository; it reuses
the page-cache control and the table from here.

Workload, identical for every contender: iterate all tensors and copy each into a preallocated
destination of the same shape (what a model loader does), so every byte is touched. Cold samples
evict every file from the page cache first (posix_fadvise DONTNEED, verified with mincore); warm
samples read the files once beforehand.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

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
def destinations(files: list[str]):
    import torch

    from instanttensor import safe_open

    with safe_open(files) as f:
        dest = {n: torch.empty(s, dtype=d) for n in f.keys() for d, s in [f.get_tensor_metadata(n)]}
    for t in dest.values():  # pre-fault: the destination is not what is measured
        t.view(-1).view(torch.uint8).fill_(0)
    return dest


def _run_instanttensor(files, dest, copy: bool) -> None:
    from instanttensor import safe_open

    with safe_open(files, copy=copy) as f:
        for name, tensor in f.tensors():
            dest[name].copy_(tensor)


def _run_instanttensor_mmap(files, dest) -> None:
    from instanttensor import safe_open

    with safe_open(files, copy=False, backend="mmap") as f:
        for name, tensor in f.tensors():  # views of the mapping: the copy_ is the only pass
            dest[name].copy_(tensor)


def _run_load_into(files, dest, backend: str | None = None) -> None:
    from instanttensor import load_into

    load_into(dest, files, backend=backend)


def _run_safetensors_open(files, dest) -> None:
    from safetensors import safe_open as reference_open

    for path in files:
        with reference_open(path, framework="pt") as f:
            for name in f.keys():
                dest[name].copy_(f.get_tensor(name))




CONTENDERS: dict[str, Callable] = {
    "instanttensor copy=True": lambda f, d: _run_instanttensor(f, d, True),
    "instanttensor copy=False": lambda f, d: _run_instanttensor(f, d, False),
    "instanttensor load_into": _run_load_into,
    "instanttensor mmap copy=False": _run_instanttensor_mmap,
    "safetensors safe_open": _run_safetensors_open,
    "baseline (torch + destinations)": lambda f, d: None,
}


def measure(run: Callable, files: list[str], before: Callable | None = None) -> dict:
    """Runs `run(files, destinations)` once in this process: seconds and peak RSS."""
    dest = destinations(files)
    if before:
        before(dest)
    start = time.perf_counter()
    run(files, dest)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_rss_mb": peak_kb / 1024}


def sample_in_fresh_process(command: list[str], name: str, files: list[str]) -> dict:
    """One sample: `command --worker NAME --files ...` in a fresh process, its last JSON line."""
    done = subprocess.run([*command, "--worker", name, "--files", *files], capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": last[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def sample(name: str, files: list[str]) -> dict:
    return sample_in_fresh_process([sys.executable, "-m", "instanttensor._demo_bench"], name,
                                   files)


def available(name: str) -> str | None:
    modules = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors",
               "runai-model-streamer": "runai_model_streamer"}
    for prefix, module in modules.items():
        if name.startswith(prefix):
            try:
                __import__(module)
            except Exception as error:  # noqa: BLE001 - reported in the table
                return f"not importable: {error}"
    return None


# The ceilings of each mode: cold, what the storage gives a reader doing nothing else (O_DIRECT or
# through the page cache, whichever is faster on this storage); warm, one memory copy.
CEILINGS = {"cold": ("ceiling: O_DIRECT read", "ceiling: buffered read"),
            "warm": ("ceiling: memcpy",)}


def run_table(files: list[str], names: list[str], samples: int, modes: list[str],
              json_path: str | None, sample: Callable[[str, list[str]], dict]) -> int:
    """Runs `names` (contenders, ceilings and the baseline) `samples` times each in each mode
    ("cold": evicted first, "warm": cached), interleaved, one fresh process per sample
    (`sample(name, files)`), and prints medians with the ratios to the ceiling and to
    safetensors measured in the same run. Also writes the results to `json_path`."""
    total = sum(os.path.getsize(f) for f in files)
    results: dict = {"files": files, "bytes": total, "samples": samples, "modes": {}}
    for mode in modes:
        runnable = [n for n in names
                    if not (n.startswith("ceiling: ") and n not in CEILINGS.get(mode, ()))]
        table: dict[str, dict] = {n: {"samples": []} for n in runnable}
        for n in runnable:
            reason = available(n)
            if reason:
                table[n]["error"] = reason
        # On a terminal one progress line rewrites itself; in a log each step is its own line
        # (carriage returns would run the steps together into one line).
        live = sys.stdout.isatty()
        for round_index in range(samples):
            # Each round starts one contender later: what runs right after a memory-hungry
            # contender pays for the system reclaiming its memory, so no one sits there always.
            shift = round_index % len(runnable) if runnable else 0
            for n in runnable[shift:] + runnable[:shift]:
                if "error" in table[n]:
                    continue
                left = evict(files) if mode == "cold" else warm_up(files)
                step = (f"[{mode} {round_index + 1}/{samples}] {n:34s} "
                        f"(residency before: {left:.2f})")
                print("\r" + step if live else step, end="" if live else "\n", flush=True)
                if mode == "cold" and left > 0.01:
                    table[n]["note"] = f"eviction left {left:.0%} cached"
                result = sample(n, files)
                if "error" in result:
                    table[n]["error"] = result["error"]
                else:
                    table[n]["samples"].append(result)
        if live:
            print("\r" + " " * 90 + "\r", end="")
        for row in table.values():
            if row["samples"]:
                row["seconds"] = statistics.median(s["seconds"] for s in row["samples"])
                row["gb_per_s"] = total / row["seconds"] / 1e9
                row["peak_rss_mb"] = statistics.median(s["peak_rss_mb"] for s in row["samples"])
        # The best read rate measured beside the contenders, by any method.
        rates = [table[n]["gb_per_s"] for n in CEILINGS.get(mode, ())
                 if "gb_per_s" in table.get(n, {})]
        ceiling = max(rates) if rates else None
        reference = table.get("safetensors safe_open", {}).get("gb_per_s")
        baseline = table.get("baseline (torch + destinations)", {}).get("peak_rss_mb")
        print(f"\n{mode} ({total / 1e9:.2f} GB in {len(files)} files, median of {samples}):")
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
    if json_path:
        with open(json_path, "w") as out:
            json.dump(results, out, indent=2)
        print(f"\nwrote {json_path}")
    return 0


if __name__ == "__main__":  # a worker: python -m instanttensor._demo_bench --worker NAME --files ...
    arguments = sys.argv[1:]
    name, files = arguments[1], arguments[3:]
    print(json.dumps(measure(CONTENDERS[name], files)))
