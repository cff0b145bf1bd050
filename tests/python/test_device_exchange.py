"""The device exchange on the simulated accelerator, one process per rank.

On GPUs vLLM at TP>1 passes its device group ("cpu:gloo,cuda:nccl"): the target is the GPU, so
the loader exchanges in the device ring, each rank reading 1/world of every unit into its staging
ring, copying it to the device, and the device backend all-gathering the rest. Here the same
group shape runs on the simulated device ("cpu:gloo,simdev:simccl"), whose backend runs each
collective on its own stream after the work queued on the current one, like NCCL, and carries the
bytes through host memory
(tests/simulated_device/sim_collectives.h), with the suite's random delays on every device
operation. Each rank runs on its own device (rank % 2). After every load, failed or not, the
rank checks that no collective is left pending and that its device and pinned memory is back
to zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import simulated_device

from test_distributed import (assert_read_once_in_shares, checkpoint,  # noqa: F401
                              collectives_through_a_failure, copies_per_rank, fault_library,
                              run_ranks)

DEVICE = {"device": "simdev"}


def assert_memory_back(result):
    assert result["memory_after"] == {"device": 0, "pinned": 0, "pending_collectives": 0,
                                      "stale_accesses": 0}, result


# chunk_size 4096 and a 32 KiB staging ring: many units per tensor, the ring wraps.
@pytest.mark.parametrize("world,copy", [(2, True), (2, False), (3, True), (3, False)])
def test_every_rank_gets_every_tensor_through_the_device_exchange(tmp_path, checkpoint, world,
                                                                  copy):
    paths, expected, total = checkpoint
    options = {"copy": copy, "chunk_size": 4096, "staging_size": 32 << 10}
    if not copy:
        options["buffer_size"] = 96 << 10
    results = run_ranks(tmp_path, [paths] * world, options, **DEVICE)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected  # bit-identical to a single-process load
        assert result["stats"]["exchange"] == "device (device target)"
        assert result["warnings"] == []
        assert_memory_back(result)
    assert_read_once_in_shares(results, total, world)


# A share is 4 reads of 4 KiB here: the 6th and 11th read calls fail inside a share, whose
# first pieces landed (or were copied) before the failed one.
@pytest.mark.parametrize("world,copy,fault_read", [(2, True, 3), (3, False, 3), (2, True, 6),
                                                   (2, False, 11)])
def test_a_read_error_on_one_rank_raises_on_every_rank_of_the_device_exchange(
        tmp_path, checkpoint, world, copy, fault_read):
    paths, expected, _ = checkpoint
    options = {"copy": copy, "chunk_size": 4096, "staging_size": 32 << 10}
    results = run_ranks(tmp_path, [paths] * world, options, timeout=120, fault_rank=1,
                        fault_read=fault_read, testing_library=fault_library(), retry=True,
                        retry_files=[paths] * world, **DEVICE)
    assert "Input/output error" in results[1].get("error", ""), results[1]
    for rank, result in enumerate(results):
        assert result.get("error"), result
        if rank != 1:
            assert "rank 1 failed" in result["error"] and "Input/output error" in result["error"]
        assert_memory_back(result)
        assert result["retry"].get("digests") == expected, result["retry"]  # the group works


@pytest.mark.parametrize("world", [2, 3])
def test_a_file_changed_on_one_rank_raises_on_every_rank_of_the_device_exchange(
        tmp_path, checkpoint, world):
    paths, _, _ = checkpoint
    per_rank = copies_per_rank(tmp_path, paths, world)
    results = run_ranks(tmp_path, per_rank, {"copy": True, "chunk_size": 4096}, timeout=120,
                        break_rank=1, **DEVICE)
    assert "changed since it was opened" in results[1]["error"], results[1]
    for rank, result in enumerate(results):
        if rank != 1:
            assert "rank 1 failed" in result.get("error", ""), result
        assert_memory_back(result)


def test_the_device_exchange_holds_no_shard_after_its_pass(tmp_path, checkpoint):
    # The pass releases the last shard it read when it ends, as a pass alone does: a shard
    # replaced by rename afterwards is refused by a later read, not served from the old file.
    paths, expected, _ = checkpoint
    results = run_ranks(tmp_path, copies_per_rank(tmp_path, paths, 2),
                        {"copy": True, "chunk_size": 4096}, replace_after_pass=True, **DEVICE)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert "changed since it was opened" in result["after_replace"], result
        assert_memory_back(result)


def test_load_into_on_the_device_with_a_device_group_fills_every_destination(tmp_path,
                                                                             checkpoint):
    # load_into does not exchange: each rank fills its own destinations from its reads.
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"keys": None, "chunk_size": 4096}, into=True,
                        **DEVICE)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["bytes_read"] == total
        assert_memory_back(result)


@pytest.mark.parametrize("failure,world", [(None, 2), ("read", 2), ("read", 3), ("changed", 3)])
def test_the_device_exchange_makes_the_same_collectives_in_the_same_order_whatever_fails(
        tmp_path, checkpoint, failure, world):
    _, expected, _ = checkpoint
    options = {"copy": True, "chunk_size": 4096, "staging_size": 32 << 10}
    sequences, results = collectives_through_a_failure(tmp_path, checkpoint, failure, world,
                                                       options, **DEVICE)
    assert "handshake" in sequences[0] and "status" in sequences[0]
    # The device backend is not gloo: one in-place all-gather per unit, as with NCCL.
    assert any(line.startswith("all_gather ") for line in sequences[0]), sequences[0]
    assert not any(line.startswith("broadcast ") for line in sequences[0]), sequences[0]
    for rank in range(1, world):
        assert sequences[rank] == sequences[0], (rank, sequences[0], sequences[rank])
    for result in results:
        assert_memory_back(result)
        if failure:
            assert result.get("error"), result
            assert result["retry"].get("digests") == expected, result["retry"]
        else:
            assert result.get("digests") == expected, result


def test_the_vllm_iterator_with_a_device_group_exchanges_on_the_device(tmp_path, checkpoint):
    # What vLLM does at TP=2 on GPUs, on the simulated device: its device group, copy=True.
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {}, vllm=True, **DEVICE)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["warnings"] == []
        assert_memory_back(result)


TWO_GROUPS = r"""
import json, os, sys, torch, torch.distributed as dist
rank, spec = int(sys.argv[1]), json.loads(sys.argv[2])
os.environ["INSTANTTENSOR_CMAKE_BUILD_DIR"] = spec["build_dir"]
sys.path.insert(0, spec["tests_dir"])
import simulated_device as simdev
assert simdev.register_collectives()
dist.init_process_group(simdev.DEVICE_GROUP, init_method="file://" + spec["store"], rank=rank,
                        world_size=2)
a = dist.new_group([0, 1], backend=simdev.DEVICE_GROUP)
b = dist.new_group([0, 1], backend=simdev.DEVICE_GROUP)
device = torch.device("simdev", rank)
x = torch.full((4,), rank + 1.0, device=device)
y = torch.full((4,), 10.0 * (rank + 1), device=device)
order = [(a, x), (b, y)] if rank == 0 else [(b, y), (a, x)]
works = [dist.all_reduce(t, group=g, async_op=True) for g, t in order]
for work in works:
    work.wait()
json.dump({"x": x.cpu().tolist(), "y": y.cpu().tolist()}, open(spec["out"] % rank, "w"))
dist.destroy_process_group()
"""


def test_two_simulated_groups_issued_in_opposite_orders_do_not_wait_for_each_other(tmp_path):
    # NCCL gives each communicator its own stream, so two groups' collectives issued in
    # different orders on the ranks both complete; a simulator with one collective stream per
    # device ordered them and hung here.
    if not simulated_device.register_collectives():
        pytest.skip("needs the CMake build's simulated device (INSTANTTENSOR_CMAKE_BUILD_DIR)")
    script = tmp_path / "two_groups.py"
    script.write_text(TWO_GROUPS)
    spec = {"store": str(tmp_path / "store"), "out": str(tmp_path / "rank%d.json"),
            "tests_dir": os.path.dirname(__file__), "build_dir": simulated_device.build_dir()}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), json.dumps(spec)],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for proc in procs:
            proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail("the ranks hung: one group's collective waited for the other's")
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, proc.stderr.read()
        assert json.load(open(spec["out"] % rank)) == {"x": [3.0] * 4, "y": [30.0] * 4}
