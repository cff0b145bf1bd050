#!/usr/bin/env python3
"""Writes the synthetic model-like checkpoint the benchmark uses (the generator lives in the
package: `instanttensor._demo_checkpoint`).

    python benchmarks/make_checkpoint.py /var/tmp/ckpt --size-gb 4 --files 4
"""

import argparse

from instanttensor._demo_checkpoint import write_model_like_checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--size-gb", type=float, default=4.0)
parser.add_argument("--files", type=int, default=4)
args = parser.parse_args()
for path in write_model_like_checkpoint(args.folder, total_mb=int(args.size_gb * 1024),
                                        files=args.files, hidden=4096, vocab=32000):
    print(path)
