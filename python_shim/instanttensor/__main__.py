"""Command line: `python -m instanttensor [demo|inspect] ...`."""

from __future__ import annotations

import argparse
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

    from . import bench
    from ._demo_checkpoint import write_model_like_checkpoint

    folder = args.dir or os.path.join(tempfile.gettempdir(), "instanttensor-demo")
    marker = os.path.join(folder, f".complete-{args.size_mb}")
    if not os.path.exists(marker):
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
    run_args = argparse.Namespace(
        checkpoint=folder, samples=args.samples, modes="cold,warm", json=args.json, ranks=0,
        only=",".join(names + ["baseline (torch + destinations)"]), size_gb=None, dir=None)
    code = bench.run(run_args)
    print("\nwhat each path is for:")
    for name in names:
        print(f"  {name:30s} {PATHS[name]}")
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
    demo.add_argument("--size-mb", type=int, default=256)
    demo.add_argument("--dir", default=None, help="where to keep the checkpoint")
    demo.add_argument("--samples", type=int, default=3)
    demo.add_argument("--json", default=None, help="also write the results as JSON here")
    from . import bench

    bench.add_arguments(commands.add_parser("bench", help="benchmark against peers and ceilings"))
    inspect = commands.add_parser("inspect", help="list the tensors of safetensors files")
    inspect.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo"] + (argv or []))
    try:
        if args.command == "bench":
            return bench.run(args)
        return _demo(args) if args.command == "demo" else _inspect(args)
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
