"""Command line: `python -m instanttensor [demo|inspect] ...`."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def _demo(args: argparse.Namespace) -> int:
    import torch

    from . import safe_open
    from ._demo_checkpoint import write_model_like_checkpoint

    folder = args.dir or os.path.join(tempfile.gettempdir(), "instanttensor-demo")
    marker = os.path.join(folder, f".complete-{args.size_mb}")
    if not os.path.exists(marker):
        print(f"writing a {args.size_mb} MB model-like checkpoint to {folder} ...", flush=True)
        for old in os.listdir(folder) if os.path.isdir(folder) else []:
            os.remove(os.path.join(folder, old))
        write_model_like_checkpoint(folder, total_mb=args.size_mb)
        open(marker, "w").close()
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))

    # The workload every contender runs: copy each tensor into a preallocated destination of
    # the same shape, as a model loader does, so every byte is touched (mmap readers are lazy).
    with safe_open(files) as f:
        destinations = {name: torch.empty(shape, dtype=dtype)
                        for name in f.keys() for dtype, shape in [f.get_tensor_metadata(name)]}
        total = f.total_tensor_size
    for tensor in destinations.values():
        tensor.view(-1).view(torch.uint8).fill_(0)  # pre-fault

    def report(label: str, seconds: float, extra: str = "") -> None:
        print(f"{label:28s}: {len(destinations)} tensors, {total / 1e6:.1f} MB in {seconds:.3f} s"
              f" = {total / seconds / 1e9:.2f} GB/s{extra}", flush=True)

    def ours(copy: bool) -> None:
        start = time.perf_counter()
        with safe_open(files, device="cpu", copy=copy) as f:
            for name, tensor in f.tensors():
                destinations[name].copy_(tensor)
            stats = f.stats()
        report(f"instanttensor copy={copy}", time.perf_counter() - start,
               f" (materializations {stats['materializations']}, backend {stats['backend']})")

    def reference() -> None:
        from safetensors import safe_open as reference_open

        start = time.perf_counter()
        for path in files:
            with reference_open(path, framework="pt") as f:
                for name in f.keys():
                    destinations[name].copy_(f.get_tensor(name))
        report("safetensors safe_open", time.perf_counter() - start)

    from .bench import warm_up

    residency = warm_up(files)  # every contender then reads from the page cache
    print(f"checkpoint: {len(files)} files, {total / 1e6:.1f} MB in {folder}; "
          f"torch {torch.__version__}; page cache warm ({residency:.0%} resident)")
    contenders = [lambda: ours(True), lambda: ours(False)]
    try:
        import safetensors  # noqa: F401

        contenders.append(reference)
    except ImportError:
        pass
    for _ in range(2):  # interleaved rounds
        for run in contenders:
            run()
    return 0


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
