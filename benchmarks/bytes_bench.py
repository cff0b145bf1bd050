"""The safetensors face's in-memory calls against the reference on the same tensors: torch
`save` (bytes) and `load` (bytes), numpy `save` and `load`, and numpy `save_file` / `load_file`
(instanttensor's save_file fsyncs and renames; the reference's writes in place). Interleaved, a
fresh process per sample, medians; the ceiling is one memcpy of the data (bytes(...) of it).

    python benchmarks/bytes_bench.py [--size-mb 512] [--samples 3] [--dir /tmp/it-bytes]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SAMPLE = """
import os, sys, time, numpy as np, torch
library, call, path, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
count = 8
tensors = {f"w{i}": torch.ones(size // 4 // count) for i in range(count)}
arrays = {name: t.numpy() for name, t in tensors.items()}
if library == "instanttensor":
    import instanttensor.numpy as np_face, instanttensor.torch as pt_face
else:
    import safetensors.numpy as np_face, safetensors.torch as pt_face
data = pt_face.save(tensors)
if call == "np.save_file":
    np_face.save_file(arrays, path)
start = time.perf_counter()
if call == "memcpy":
    out = bytes(memoryview(data))
elif call == "pt.save":
    out = pt_face.save(tensors)
elif call == "pt.load":
    out = pt_face.load(data)
elif call == "np.save":
    out = np_face.save(arrays)
elif call == "np.load":
    out = np_face.load(data)
elif call == "np.save_file":
    np_face.save_file(arrays, path)
elif call == "np.load_file":
    out = np_face.load_file(path)
print(time.perf_counter() - start)
"""

CALLS = ["pt.save", "pt.load", "np.save", "np.load", "np.save_file", "np.load_file"]


def sample(library: str, call: str, path: str, size: int) -> float:
    out = subprocess.run([sys.executable, "-c", SAMPLE, library, call, path, str(size)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/instanttensor-bytes-bench")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    size = args.size_mb << 20
    path = os.path.join(args.dir, "bench.safetensors")
    times: dict[str, list[float]] = {"ceiling: memcpy": []}
    for call in CALLS:
        for library in ("instanttensor", "safetensors"):
            times[f"{library} {call}"] = []
    for _ in range(args.samples):
        times["ceiling: memcpy"].append(sample("safetensors", "memcpy", path, size))
        for call in CALLS:
            for library in ("instanttensor", "safetensors"):
                times[f"{library} {call}"].append(sample(library, call, path, size))
    ceiling = statistics.median(times["ceiling: memcpy"])
    results = {}
    print(f"{args.size_mb} MB, median of {args.samples}, fresh process per sample")
    print(f"  {'call':32s} {'seconds':>8s} {'GB/s':>6s} {'x ceiling':>9s} {'x safetensors':>13s}")
    for name, samples in times.items():
        seconds = statistics.median(samples)
        call = name.split(" ", 1)[1]
        peer = times.get(f"safetensors {call}")
        ratio = statistics.median(peer) / seconds if peer else None
        results[name] = {"seconds": seconds, "gb_per_s": size / seconds / 1e9,
                         "x_ceiling": seconds and ceiling / seconds, "x_safetensors": ratio}
        shown = f"{ratio:13.2f}" if ratio else f"{'-':>13s}"
        print(f"  {name:32s} {seconds:8.3f} {size / seconds / 1e9:6.2f} "
              f"{ceiling / seconds:9.2f} {shown}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"size_mb": args.size_mb, "samples": args.samples, "results": results},
                      out, indent=1)


if __name__ == "__main__":
    main()
