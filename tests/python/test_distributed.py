"""Distributed loading with gloo on the CPU: every rank gets every tensor, reading ~1/world."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file as reference_save

RANK_SCRIPT = textwrap.dedent("""
    import hashlib, json, os, sys
    import torch
    import torch.distributed as dist
    import instanttensor

    rank, world = int(sys.argv[1]), int(sys.argv[2])
    files, store, out, copy = json.loads(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6] == "1"
    break_rank = int(sys.argv[7])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    result = {"rank": rank}
    try:
        with instanttensor.safe_open(files, process_group=dist.group.WORLD, copy=copy,
                                     buffer_size=None if copy else 96 << 10) as f:
            if rank == break_rank:
                os.truncate(files[-1], 64)  # this rank's copy changes after the handshake
            digests = {}
            for name, tensor in f.tensors():
                data = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                digests[name] = hashlib.sha256(data).hexdigest()
            result.update(digests=digests, stats=f.stats(), total=f.total_tensor_size)
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}"
    with open(out, "w") as handle:
        json.dump(result, handle)
    dist.destroy_process_group()
""")


def run_ranks(tmp_path, files_per_rank: list[list[str]], copy: bool, timeout: float = 120,
              break_rank: int = -1):
    store = tmp_path / "store"
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    world = len(files_per_rank)
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world),
                               json.dumps(files_per_rank[r]), str(store), str(outs[r]),
                               "1" if copy else "0", str(break_rank)],
                              stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a rank hung")
    results = []
    for proc, out in zip(procs, outs):
        assert out.exists(), proc.stderr.read()
        results.append(json.loads(out.read_text()))
    return results


@pytest.fixture
def checkpoint(tmp_path):
    import hashlib

    torch.manual_seed(3)
    tensors = {f"layer.{i}.weight": torch.randn(40 + i, 64) for i in range(12)}
    tensors["embed"] = torch.randn(300, 64).to(torch.bfloat16)
    tensors["empty"] = torch.empty(0, 3)
    tensors["scalar"] = torch.tensor(7, dtype=torch.int64)
    names = sorted(tensors)
    paths = []
    for index in range(2):
        path = str(tmp_path / f"shard-{index}.safetensors")
        reference_save({n: tensors[n] for n in names[index::2]}, path)
        paths.append(path)
    digests = {n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
               .hexdigest() for n, t in tensors.items()}
    return paths, digests, sum(t.nbytes for t in tensors.values())


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("copy", [True, False])
def test_every_rank_gets_every_tensor_reading_a_share(tmp_path, checkpoint, world, copy):
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * world, copy)
    read = []
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected  # bit-identical to a single-process load
        assert result["total"] == total
        read.append(result["stats"]["bytes_read"])
        assert result["stats"]["bytes_read"] + result["stats"]["bytes_received"] >= total
    assert sum(read) <= total + world * 2 * 8192  # storage read about once in total
    for share in read:
        assert share < total * 0.8, read  # nobody reads (nearly) everything


def test_mismatched_files_raise_on_every_rank(tmp_path, checkpoint):
    paths, _, _ = checkpoint
    results = run_ranks(tmp_path, [paths, paths[:1]], copy=True, timeout=60)
    for result in results:
        assert "error" in result, result
        assert "ranks opened different checkpoints" in result["error"]


def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path, checkpoint):
    import shutil

    paths, _, _ = checkpoint
    per_rank = []
    for rank in range(2):  # identical copies, so the handshake passes
        folder = tmp_path / f"copy{rank}"
        folder.mkdir()
        per_rank.append([shutil.copy(p, folder / os.path.basename(p)) for p in paths])
    results = run_ranks(tmp_path, [[str(p) for p in r] for r in per_rank], copy=True,
                        timeout=60, break_rank=1)
    assert "changed since it was opened" in results[1]["error"], results[1]
    assert "rank 1 failed" in results[0]["error"], results[0]
