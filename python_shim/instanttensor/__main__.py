"""Command line: `python -m instanttensor [demo|inspect] ...`."""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile


PATHS = {
    "instanttensor load_into": "fill tensors you own (model.state_dict()) in place: one pass, "
                               "no loader memory",
    "instanttensor copy=True": "iterate owned tensors (safetensors' contract): two passes, the "
                               "first touch of fresh memory bounds it warm",
    "instanttensor copy=False": "iterate borrowed views of a bounded ring (vLLM's "
                                "INSTANTTENSOR_COPY=0): memory stays at buffer_size",
    "instanttensor mmap copy=False": "views of the file mapping (backend='mmap', explicit: SIGBUS "
                                     "if the file is truncated under live views)",
    "safetensors safe_open": "the reference reader, for comparison",
}


def _demo(args: argparse.Namespace) -> int:
    import torch

    from . import _demo_bench
    from ._demo_checkpoint import write_model_like_checkpoint

    folder = args.checkpoint or args.dir or os.path.join(tempfile.gettempdir(),
                                                         "instanttensor-demo")
    marker = os.path.join(folder, f".complete-{args.size_mb}")
    if not args.checkpoint and not os.path.exists(marker):
        print(f"writing a {args.size_mb} MB model-like checkpoint to {folder} ...", flush=True)
        for old in os.listdir(folder) if os.path.isdir(folder) else []:
            os.remove(os.path.join(folder, old))
        write_model_like_checkpoint(folder, total_mb=args.size_mb)
        open(marker, "w").close()
    print(f"torch {torch.__version__}; every contender copies each tensor into a preallocated "
          "destination (load_into fills it directly); fresh process per sample, interleaved, "
          "medians; cold = evicted from the page cache first, warm = cached.", flush=True)
    names = list(PATHS)
    try:
        import safetensors  # noqa: F401
    except ImportError:
        names.remove("safetensors safe_open")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"no .safetensors files in {folder}")
    code = _demo_bench.run_table(files, names + ["baseline (torch + destinations)"], args.samples,
                                 ["cold", "warm"], args.json, _demo_bench.sample)
    print("\nwhat each path is for:")
    for name in names:
        print(f"  {name:30s} {PATHS[name]}")
    print("\npeers (fastsafetensors, runai), physical ceilings, ranks and scenarios: "
          "benchmarks/bench.py in the repository (benchmarks/README.md)")
    return code


def _inspect(args: argparse.Namespace) -> int:
    from . import safe_open

    with safe_open(args.files) as f:
        for name in f.offset_keys():
            dtype, shape = f.get_tensor_metadata(name)
            print(f"{name}\t{str(dtype).removeprefix('torch.')}\t{list(shape)}")
        print(f"# {len(f.keys())} tensors, {f.total_tensor_size} bytes, metadata {f.metadata()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instanttensor")
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="write a model-like checkpoint and load it (default)")
    bench = commands.add_parser("bench", help="the demo's comparison, on a checkpoint of yours "
                                "(--checkpoint DIR) or a generated one")
    for parser_of in (demo, bench):
        parser_of.add_argument("--size-mb", type=int, default=256)
        parser_of.add_argument("--dir", default=None, help="where to keep the checkpoint")
        parser_of.add_argument("--checkpoint", default=None,
                               help="a folder of .safetensors files to load instead")
        parser_of.add_argument("--samples", type=int, default=3)
        parser_of.add_argument("--json", default=None, help="also write the results as JSON here")
    inspect = commands.add_parser("inspect", help="list the tensors of safetensors files")
    inspect.add_argument("files", nargs="+")
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("demo", "bench", "inspect", "-h", "--help"):
        argv = ["demo"] + argv  # the demo is the default command, with its own options
    args = parser.parse_args(argv)
    try:
        return _demo(args) if args.command in ("demo", "bench") else _inspect(args)
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
