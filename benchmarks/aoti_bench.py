"""AOTInductor: time from process start to the first inference of a ~1 GB model, and a swap of
the whole weights under inference. Not a test.

    python benchmarks/aoti_bench.py [--samples 3] [--dim 4096] [--layers 16] [--json FILE]

The model (a stack of `layers` Linear(dim, dim) + GELU, fp32: 1.07 GB at the defaults) is
compiled once under /var/tmp into two packages: with its constants inside (torch's default) and
without (aot_inductor.package_constants_in_so=False), beside its weights in safetensors.
Contenders, each a fresh process per sample, interleaved (the order rotates each round):

  inside      Python: torch._inductor.aoti_load_package(inside.pt2), run (torch's default)
  it_cpp      C++: examples/aoti_inference (AOTIModelPackageLoader + instanttensor::load_constants)
  it_python   Python: instanttensor.aoti.load_package + load_constants, run
  torch_st    Python: aoti_load_package + safetensors.torch.load_file + load_constants, run
  read        a ceiling: a process that reads model.safetensors (buffered, 64 MiB reads)
  read4       another: 4 threads pread it in 8 MiB chunks (the ceiling is the faster of the two)

The time is the parent's, from starting the process to the first output line ("output0 ..."),
which each prints after its first inference; peak RSS is the child's (wait4). Cold evicts the
files a contender reads (posix_fadvise DONTNEED, checked with mincore: a sample left over 5%
resident is refused); warm reads them first. The swap: one process serves (a thread runs the model
back to back) while the main thread loads next.safetensors into the inactive buffer, then swaps;
it reports the runs' median latency before and during the load, with the loader's default
threads and with concurrency=1 (one read worker, leaving the server more of the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import torch

from instanttensor._demo_bench import evict, warm_up

ROOT = pathlib.Path(__file__).resolve().parent.parent

MODEL = """
import torch
class Stack(torch.nn.Module):
    def __init__(self, dim, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x
"""

WORKERS = {
    "inside": """
import sys, torch, safetensors.torch
package = torch._inductor.aoti_load_package(sys.argv[1])
x = safetensors.torch.load_file(sys.argv[3])["x"]
print("output0", float(package(x).sum()), flush=True)
""",
    "it_python": """
import sys, torch, instanttensor.aoti as aoti, instanttensor.torch
package = aoti.load_package(sys.argv[1])
aoti.load_constants(package, sys.argv[2])
x = instanttensor.torch.load_file(sys.argv[3])["x"]
print("output0", float(package(x).sum()), flush=True)
""",
    "torch_st": """
import sys, torch, safetensors.torch
package = torch._inductor.aoti_load_package(sys.argv[1])
package.load_constants(safetensors.torch.load_file(sys.argv[2]), check_full_update=True)
x = safetensors.torch.load_file(sys.argv[3])["x"]
print("output0", float(package(x).sum()), flush=True)
""",
    "read": """
import sys
with open(sys.argv[2], "rb", buffering=0) as f:
    while f.read(64 << 20):
        pass
print("output0", flush=True)
""",
    "read4": """
import os, sys, threading
fd = os.open(sys.argv[2], os.O_RDONLY)
size, chunk = os.fstat(fd).st_size, 8 << 20
def reader(first):
    for offset in range(first * chunk, size, 4 * chunk):
        os.pread(fd, chunk, offset)
threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("output0", flush=True)
""",
}


def prepare(folder: pathlib.Path, dim: int, layers: int) -> dict[str, str]:
    files = {name: str(folder / name) for name in
             ("inside.pt2", "free.pt2", "model.safetensors", "next.safetensors",
              "inputs.safetensors")}
    folder.mkdir(parents=True, exist_ok=True)
    if not all(os.path.exists(p) for p in files.values()):
        script = MODEL + f"""
import safetensors.torch
torch.manual_seed(0)
model = Stack({dim}, {layers}).eval()
x = torch.randn(1, {dim})
safetensors.torch.save_file({{"x": x}}, {files["inputs.safetensors"]!r})
weights = {{k: v.contiguous() for k, v in model.state_dict().items()}}
safetensors.torch.save_file(weights, {files["model.safetensors"]!r})
safetensors.torch.save_file({{k: torch.randn_like(v) for k, v in weights.items()}},
                            {files["next.safetensors"]!r})
exported = torch.export.export(model, (x,))
for path, inside in (({files["free.pt2"]!r}, False), ({files["inside.pt2"]!r}, True)):
    torch._inductor.aoti_compile_and_package(exported, package_path=path[:-4] + ".part.pt2",
        inductor_configs={{"aot_inductor.package_constants_in_so": inside}})
    import os; os.replace(path[:-4] + ".part.pt2", path)
"""
        subprocess.run([sys.executable, "-c", script], check=True)
    app = folder / "example-build" / "aoti_inference"
    if not app.exists():
        import instanttensor

        prefix = f"{instanttensor.cmake_prefix_path};{torch.utils.cmake_prefix_path}"
        build = folder / "example-build"
        subprocess.run(["cmake", "-S", str(ROOT / "examples"), "-B", str(build),
                        f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "aoti_inference"], check=True,
                       stdout=subprocess.DEVNULL)
    files["app"] = str(app)
    return files


def command(contender: str, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """(argv, the files it reads)."""
    package = files["inside.pt2"] if contender == "inside" else files["free.pt2"]
    reads = [package, files["model.safetensors"]] if contender != "inside" else [package]
    if contender.startswith("read"):
        reads = [files["model.safetensors"]]
    args = [package, files["model.safetensors"], files["inputs.safetensors"]]
    if contender == "it_cpp":
        return [files["app"], *args], reads
    return [sys.executable, "-c", WORKERS[contender], *args], reads


# Runs argv as its child and reports the child's peak RSS: a process forked from this one (torch
# loaded) would count this one's pages in its own peak, carried across exec; the spawner's child
# starts from the spawner's small image.
SPAWNER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\nMAXRSS_KB {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def sample(contender: str, files: dict[str, str], cold: bool) -> tuple[float, float]:
    """(seconds from start to the first output line, peak RSS in GB)."""
    argv, reads = command(contender, files)
    if cold:
        left = evict(reads)
        if left > 0.05:
            raise RuntimeError(f"{left:.0%} of a file stayed cached after eviction")
    else:
        if warm_up(reads) < 0.95:
            raise RuntimeError("a file did not stay cached")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-S", "-c", SPAWNER, *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    for line in child.stdout:
        if line.startswith("output0") and first is None:
            first = time.perf_counter() - start
    errors = child.stderr.read()
    if child.wait() != 0 or first is None:
        raise RuntimeError(f"{contender} failed: {errors[-3000:]}")
    peak_kb = int(errors.rsplit("MAXRSS_KB", 1)[1].split()[0])
    return first, peak_kb / (1 << 20)


SWAP = """
import sys, threading, time, statistics, torch
import instanttensor.aoti as aoti, safetensors.torch
from instanttensor._demo_bench import evict
torch.set_num_threads(1)  # the server's thread; the loader gets the other core
package = aoti.load_package(sys.argv[1])
aoti.load_constants(package, sys.argv[2])
x = safetensors.torch.load_file(sys.argv[3])["x"]
latencies, marks, stop = [], [], threading.Event()
def serve():
    while not stop.is_set():
        begin = time.perf_counter()
        package(x)
        latencies.append((begin, time.perf_counter() - begin))
server = threading.Thread(target=serve)
server.start()
while len(latencies) < 20:
    time.sleep(0.01)
if sys.argv[5] == "cold":
    evict([sys.argv[4]])
load_start = time.perf_counter()
concurrency = int(sys.argv[6]) if sys.argv[6] != "default" else None
aoti.load_constants(package, sys.argv[4], use_inactive=True, concurrency=concurrency)
load_end = time.perf_counter()
package.swap_constant_buffer()
swapped = time.perf_counter()
package.free_inactive_constant_buffer()
n = len(latencies)
while len(latencies) < n + 5:
    time.sleep(0.01)
stop.set(); server.join()
before = [d for b, d in latencies if b + d < load_start]
during = [d for b, d in latencies if b >= load_start and b + d <= load_end]
print("SWAP", load_end - load_start, swapped - load_end, statistics.median(before),
      statistics.median(during) if during else float("nan"), len(during), flush=True)
"""


def swap_sample(files: dict[str, str], cold: bool, concurrency: str) -> dict[str, float]:
    run = subprocess.run([sys.executable, "-c", SWAP, files["free.pt2"], files["model.safetensors"],
                          files["inputs.safetensors"], files["next.safetensors"],
                          "cold" if cold else "warm", concurrency], capture_output=True,
                         text=True, check=True)
    line = next(l for l in run.stdout.splitlines() if l.startswith("SWAP"))
    load, swap, before, during, runs = (float(v) for v in line.split()[1:])
    return {"load_s": load, "swap_s": swap, "latency_before_ms": before * 1e3,
            "latency_during_ms": during * 1e3, "runs_during_load": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--contenders", default="inside,it_cpp,it_python,torch_st,read,read4")
    parser.add_argument("--json")
    args = parser.parse_args()
    if shutil.which("cmake") is None:
        sys.exit("needs cmake (the C++ contender is built from examples/)")
    folder = pathlib.Path(f"/var/tmp/instanttensor-aoti-bench-{args.dim}x{args.layers}")
    files = prepare(folder, args.dim, args.layers)
    size_gb = os.path.getsize(files["model.safetensors"]) / 1e9
    contenders = args.contenders.split(",")
    results: dict = {"model_gb": size_gb, "cells": {}}
    print(f"model {size_gb:.2f} GB, {args.samples} samples per cell, medians")
    for cold in (True, False):
        cell = "cold" if cold else "warm"
        times = {c: [] for c in contenders}
        rss = {c: [] for c in contenders}
        for round_index in range(args.samples):
            shift = round_index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                seconds, peak = sample(contender, files, cold)
                times[contender].append(seconds)
                rss[contender].append(peak)
        medians = {c: statistics.median(times[c]) for c in contenders}
        results["cells"][cell] = {c: {"seconds": times[c], "median_s": medians[c],
                                      "peak_rss_gb": max(rss[c])} for c in contenders}
        ceiling = min((medians[c] for c in ("read", "read4") if c in medians), default=None)
        print(f"\n{cell}: start to first inference")
        for c in contenders:
            against = f"{medians[c] / ceiling:5.2f}x the ceiling's time" if ceiling else ""
            print(f"  {c:10s} {medians[c]:7.2f} s   peak RSS {max(rss[c]):5.2f} GB   {against}")
        for peer in ("torch_st", "inside"):
            if "it_cpp" in medians and peer in medians:
                print(f"  it_cpp / {peer}: {medians['it_cpp'] / medians[peer]:.2f}x the time, "
                      f"{max(rss['it_cpp']) / max(rss[peer]):.2f}x the peak RSS")
    print("\nswap of the whole weights under inference (one serving thread)")
    for cold, concurrency in ((True, "default"), (False, "default"), (True, "1"), (False, "1")):
        swaps = [swap_sample(files, cold, concurrency) for _ in range(args.samples)]
        summary = {k: statistics.median(s[k] for s in swaps) for k in swaps[0]}
        name = f"swap_{'cold' if cold else 'warm'}_concurrency_{concurrency}"
        results["cells"][name] = {"samples": swaps, "median": summary}
        print(f"  {'cold' if cold else 'warm'}, concurrency={concurrency}: load {summary['load_s']:.2f} s, swap "
              f"{summary['swap_s'] * 1e3:.2f} ms, run latency {summary['latency_before_ms']:.1f} "
              f"ms before -> {summary['latency_during_ms']:.1f} ms during the load "
              f"({summary['latency_during_ms'] / summary['latency_before_ms']:.2f}x, "
              f"{summary['runs_during_load']:.0f} runs served during it)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
