#!/usr/bin/env python3
"""Writes the fuzz seed corpus: valid files and one file per reference rule and bug family.

    python tests/fuzz/make_seeds.py tests/fuzz/corpus
"""

import json
import os
import struct
import sys


def raw(header, data=b"", length=None):
    header = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def padded(header: dict, data: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    return raw(text, data)


SEEDS = {
    "valid_one": padded({"w": entry("F32", [2], 0, 8)}, b"\x01" * 8),
    "valid_many": padded({f"t{i}": entry("BF16", [2, 2], 8 * i, 8 * i + 8) for i in range(6)},
                         bytes(range(48))),
    "valid_metadata": padded({"__metadata__": {"format": "pt"}, "s": entry("I64", [], 0, 8)},
                             b"\x02" * 8),
    "valid_empty_tensors": padded({"a": entry("F32", [0], 0, 0), "b": entry("U8", [0, 3], 0, 0)},
                                  b""),
    "valid_f4": padded({"q": entry("F4", [2, 2], 0, 2)}, b"ab"),
    "valid_unaligned": raw(json.dumps({"a": entry("U8", [1], 0, 1), "b": entry("F32", [1], 1, 5)}),
                           b"\0" * 5),
    "too_small": b"\x01\x02",
    "header_too_large": struct.pack("<Q", 100_000_001) + b"{}",
    "header_past_end": struct.pack("<Q", 4096) + b"{}",
    "not_utf8": raw(b'{"\xff":1}'),
    "nul_padding": raw(b"{}\0\0\0\0\0\0"),
    "unknown_dtype": raw(json.dumps({"w": entry("F33", [1], 0, 4)}), b"\0" * 4),
    "negative_dim": raw(json.dumps({"w": entry("F32", [-1], 0, 4)}), b"\0" * 4),
    "overflow": raw(json.dumps({"w": entry("F32", [2**32, 2**32, 4], 0, 4)}), b"\0" * 4),
    "gap": raw(json.dumps({"w": entry("F32", [1], 4, 8)}), b"\0" * 8),
    "overlap": raw(json.dumps({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}),
                   b"\0" * 8),
    "span_mismatch": raw(json.dumps({"w": entry("F32", [4], 0, 8)}), b"\0" * 8),
    "trailing": raw(json.dumps({"w": entry("F32", [1], 0, 4)}), b"\0" * 8),
    "truncated": raw(json.dumps({"w": entry("F32", [4], 0, 16)}), b"\0" * 8),
    "duplicate": raw('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                     '"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"),
    "metadata_tensor": raw(json.dumps({"__metadata__": entry("F32", [1], 0, 4)}), b"\0" * 4),
    "polyglot_zip_tail": padded({"w": entry("U8", [4], 0, 4)}, b"PK\x05\x06"),
}

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
os.makedirs(folder, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(folder, name), "wb") as out:
        out.write(data)
print(f"{len(SEEDS)} seeds in {folder}")
