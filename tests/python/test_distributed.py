"""Distributed loading with gloo on the CPU, one process per rank.

By default (exchange="auto") a host target's ranks read alone through the page cache they
share, meeting in status rounds; the tests of the exchange itself force it (exchange="always").
The exchange runs in units: each rank reads its slice of a unit, a status round, then one
in-place all-gather. With `_force_staging` the same exchange runs in the transfer stage's device
ring (a CPU "device" here), the path NCCL takes on GPUs. Groups are shaped like the ones vLLM
passes: "cuda:gloo" has a backend for cuda only (like NCCL), "cpu:gloo,cuda:gloo" has both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file as reference_save

import simulated_device

RANK_SCRIPT = textwrap.dedent("""
    import gc, hashlib, json, os, sys, warnings
    import torch
    import torch.distributed as dist
    import instanttensor

    rank, world, spec = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    files = spec["files"][rank]
    spec["options"].update(spec.get("rank_options", {}).get(str(rank), {}))
    os.environ.update(spec.get("rank_env", {}).get(str(rank), {}))  # read at open
    if spec.get("fault_rank") == rank:
        torch.ops.load_library(spec["testing_library"])
    simdev = None
    if spec.get("device") == "simdev":
        # The simulated device with its collectives: each rank on its own device, the group
        # shaped like vLLM's on GPUs ("cpu:gloo,simdev:simccl", as "cpu:gloo,cuda:nccl").
        os.environ["INSTANTTENSOR_CMAKE_BUILD_DIR"] = spec["build_dir"]
        sys.path.insert(0, spec["tests_dir"])
        import simulated_device as simdev
        assert simdev.register_collectives()
        spec.setdefault("backend", simdev.DEVICE_GROUP)
        spec["options"]["device"] = f"simdev:{rank % 2}"
    dist.init_process_group(spec.get("backend", "gloo"), init_method="file://" + spec["store"],
                            rank=rank, world_size=world)

    def load_like_vllm(result):
        # vLLM's --load-format instanttensor: the world's device group, copy=True, a tqdm bar
        # in bytes on rank 0.
        import tqdm.auto
        from instanttensor.integrations.vllm import instanttensor_weights_iterator
        bars = []

        class RecordingBar:
            def __init__(self, **kwargs):
                bars.append(kwargs)
                self.done = 0
            def update(self, n):
                self.done += n
                bars[-1]["done"] = self.done
            def close(self):
                pass

        tqdm.auto.tqdm = RecordingBar
        if simdev is not None:  # what torch.cuda would answer on a GPU: this rank's device
            import instanttensor.integrations.vllm as integration
            integration._default_device = lambda: torch.device(spec["options"]["device"])
        digests = {}
        for name, tensor in instanttensor_weights_iterator(files, True, dist.group.WORLD):
            digests[name] = hashlib.sha256(
                tensor.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        result.update(digests=digests, bars=bars)

    def load(result, inject):
        if spec.get("vllm"):
            return load_like_vllm(result)
        if spec.get("into"):
            with instanttensor.safe_open(files, process_group=dist.group.WORLD,
                                         **spec["options"]) as f:
                destinations = {}
                for name in f.keys():
                    dtype, shape = f.get_tensor_metadata(name)
                    destinations[name] = torch.empty(shape, dtype=dtype,
                                                     device=spec["options"].get("device", "cpu"))
                f.load_into(destinations)
                result.update(digests={
                    n: hashlib.sha256(t.cpu().view(-1).view(torch.uint8).numpy().tobytes())
                    .hexdigest() for n, t in destinations.items()}, stats=f.stats())
            return
        with instanttensor.safe_open(files, process_group=dist.group.WORLD, **spec["options"]) as f:
            if inject and spec.get("break_rank") == rank:
                os.truncate(files[-1], 64)  # this rank's copy changes after the handshake
            if inject and spec.get("fault_rank") == rank:
                torch.ops.instanttensor_testing.arm_read_fault(spec["fault_read"], 5)
            digests = {}
            for name, tensor in f.tensors():
                data = tensor.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                digests[name] = hashlib.sha256(data).hexdigest()
            result.update(digests=digests, stats=f.stats(), total=f.total_tensor_size)
            if spec.get("replace_after_pass"):
                # A shard replaced by rename once the pass is over: the pass holds no file
                # after its end, so a later read of it checks the path and is refused.
                from safetensors import safe_open as reference_open
                with reference_open(files[-1], "pt") as reference:
                    name = next(iter(reference.keys()))
                os.replace(files[0], files[-1])
                try:
                    f.get_tensor(name)
                    result["after_replace"] = "served"
                except Exception as error:
                    result["after_replace"] = str(error)

    result = {"rank": rank}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load(result, inject=True)
        except Exception as error:
            result["error"] = f"{type(error).__name__}: {error}"
    result["warnings"] = [str(w.message) for w in caught if "instanttensor" in str(w.message)]
    if simdev is not None:
        # After the load, failed or not, and its tensors gone: every collective it issued has
        # run (none left pending on the group), its device and pinned memory is back, and no
        # queued copy found its device memory freed.
        device = rank % 2
        gc.collect()  # a failed load's traceback frames form cycles that hold its last tensor
        simdev.torch.ops.simdev.synchronize(device)
        backend = dist.group.WORLD._get_backend(torch.device("simdev"))
        result["memory_after"] = {"device": simdev.device_bytes(device),
                                  "pinned": simdev.pinned_bytes(),
                                  "pending_collectives": simdev.pending_collectives(backend),
                                  "stale_accesses": simdev.stale_accesses()}
    if "error" in result and spec.get("retry"):
        # The group is left clean: a new loader on it works.
        files = spec["retry_files"][rank]
        retry = {}
        try:
            load(retry, inject=False)
        except Exception as error:
            retry["error"] = f"{type(error).__name__}: {error}"
        result["retry"] = retry
    with open(spec["out"] % rank, "w") as handle:
        json.dump(result, handle)
    # Every rank leaves together: a rank done early (a load that needs no collective) must not
    # close its connections while another is still joining the group (gloo's connectFullMesh
    # then fails there with "Connection closed by peer"). Through the store: a group whose only
    # backend serves another device cannot run a barrier on the host.
    import datetime
    store = dist.distributed_c10d._get_default_store()
    store.set(f"left{rank}", "1")
    try:
        store.wait([f"left{r}" for r in range(world)], datetime.timedelta(seconds=60))
    except Exception:
        pass  # a rank that died: run_ranks reports it
    dist.destroy_process_group()
""")


# Read at import: the suite's autouse fixture clears INSTANTTENSOR_* variables for each test.
CMAKE_BUILD_DIR = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")


def fault_library() -> str:
    build = CMAKE_BUILD_DIR
    path = os.path.join(build or "", "libinstanttensor_testing.so")
    if not build or not os.path.exists(path):
        pytest.skip("needs the CMake build's test-only library (INSTANTTENSOR_CMAKE_BUILD_DIR)")
    return path


def run_ranks(tmp_path, files_per_rank, options, timeout=180, env=None, stderr=None, **spec):
    """Runs one process per rank; `stderr`, a file every rank then writes to (else a pipe each)."""
    world = len(files_per_rank)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    spec.update(files=files_per_rank, options=options, store=str(tmp_path / "store"),
                out=str(tmp_path / "rank%d.json"), tests_dir=os.path.dirname(__file__))
    if spec.get("device") == "simdev":
        if not simulated_device.register_collectives():
            pytest.skip("needs the CMake build's simulated device (INSTANTTENSOR_CMAKE_BUILD_DIR)")
        spec["build_dir"] = simulated_device.build_dir()
        # The suite's delays (scripts/test.sh) on every device operation of the ranks too.
        env = {"INSTANTTENSOR_SIMDEV_DELAY": simulated_device.DELAYS_AT_IMPORT or "0",
               **(env or {})}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), json.dumps(spec)],
                              stderr=stderr or subprocess.PIPE, text=True,
                              env={**os.environ, **(env or {})})
             for r in range(world)]
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a rank hung")
    results = []
    for r, proc in enumerate(procs):
        out = tmp_path / f"rank{r}.json"
        shared = f"rank {r} wrote nothing; the shared stderr:\n{open(stderr.name).read()}" \
            if stderr else ""
        assert out.exists(), proc.stderr.read() if proc.stderr else shared
        results.append(json.loads(out.read_text()))
    return results


# Ranks that read alone meet every GiB and at the end; test-only, every 4 KiB instead, so a
# small checkpoint's ranks meet between tensors too.
MEET_OFTEN = {"INSTANTTENSOR_TESTING_STEP_ROUND_BYTES": "4096"}


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(3)
    tensors = {f"layer.{i}.weight": torch.randn(40 + i, 64) for i in range(12)}
    tensors["embed"] = torch.randn(300, 64).to(torch.bfloat16)  # spans many units
    tensors["tiny"] = torch.tensor([1, 2, 3], dtype=torch.int8)  # fewer bytes than ranks x 64
    tensors["empty"] = torch.empty(0, 3)
    tensors["scalar"] = torch.tensor(7, dtype=torch.int64)
    names = sorted(tensors)
    paths = []
    for index in range(2):
        path = str(tmp_path / f"shard-{index}.safetensors")
        reference_save({n: tensors[n] for n in names[index::2]}, path)
        paths.append(path)
    return paths, {n: digest(t) for n, t in tensors.items()}, sum(t.nbytes for t in tensors.values())


def copies_per_rank(tmp_path, paths, world):
    """Identical copies of the checkpoint, one folder per rank (so one rank's can change)."""
    per_rank = []
    for rank in range(world):
        folder = tmp_path / f"copy{rank}"
        folder.mkdir()
        per_rank.append([shutil.copy(p, folder / os.path.basename(p)) for p in paths])
    return [[str(p) for p in files] for files in per_rank]


def assert_read_once_in_shares(results, total, world):
    read = [r["stats"]["bytes_read"] for r in results]
    assert sum(read) <= total + world * 8192, read  # storage read about once in total
    for r in results:
        assert r["stats"]["bytes_read"] + r["stats"]["bytes_received"] >= total
        # Equal slices per unit: each rank reads about 1/world (plus tiny tensors' slack).
        assert r["stats"]["bytes_read"] <= total / world * 1.1 + 4096, read


# chunk_size 4096: units of world x 16 KiB (4 reads a share), so the embedding straddles many
# units and slices.
@pytest.mark.parametrize("world,copy,staged", [
    (2, True, False), (2, False, False), (2, True, True), (2, False, True),
    (3, True, False), (3, False, True)])
def test_every_rank_gets_every_tensor_reading_a_share(tmp_path, checkpoint, world, copy, staged):
    paths, expected, total = checkpoint
    options = {"copy": copy, "chunk_size": 4096, "_force_staging": staged, "exchange": "always"}
    if not copy:
        options["buffer_size"] = 96 << 10  # the ring wraps several times
    if staged:
        options["staging_size"] = 32 << 10
    results = run_ranks(tmp_path, [paths] * world, options)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected  # bit-identical to a single-process load
        assert result["total"] == total
        assert result["warnings"] == []
    assert_read_once_in_shares(results, total, world)


def test_keys_selection_exchanges_only_the_selected_tensors(tmp_path, checkpoint):
    paths, expected, _ = checkpoint
    keys = ["embed", "layer.3.weight", "tiny", "empty"]
    results = run_ranks(tmp_path, [paths] * 2,
                        {"keys": keys, "chunk_size": 4096, "exchange": "always"})
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == {k: expected[k] for k in keys}
    assert sum(r["stats"]["bytes_read"] for r in results) <= results[0]["total"] + 2 * 8192


def test_a_tensor_filter_with_a_group_exchanges_the_selection_every_rank_shares(tmp_path,
                                                                                checkpoint):
    # Upstream refuses tensor_filter with a process group; the same selection on every rank is
    # fine here: the handshake's digest covers it.
    paths, expected, _ = checkpoint
    options = {"tensor_filter": ["layer.1*", "tiny", "emb?d"], "chunk_size": 4096,
               "exchange": "always"}
    results = run_ranks(tmp_path, [paths] * 2, options)
    selected = {"layer.1.weight", "layer.10.weight", "layer.11.weight", "tiny", "embed"}
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == {k: expected[k] for k in selected}
        assert result["warnings"] == []
    assert sum(r["stats"]["bytes_read"] for r in results) <= results[0]["total"] + 2 * 8192


def test_different_tensor_filters_on_the_ranks_raise_on_every_rank(tmp_path, checkpoint):
    paths, _, _ = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"tensor_name_match_mode": "exact"},
                        rank_options={"0": {"tensor_filter": ["embed", "tiny"]},
                                      "1": {"tensor_filter": ["embed"]}})
    for result in results:
        assert "ValueError: " in result.get("error", ""), result
        assert "different checkpoints, selections" in result["error"], result


def test_a_group_without_a_backend_for_the_target_loads_locally_and_warns(tmp_path, checkpoint):
    # "cuda:gloo" registers gloo for cuda only, like vLLM's NCCL device group; the target is
    # the CPU, so there is nothing to exchange with: every rank reads everything, once warned.
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"copy": True}, backend="cuda:gloo")
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["bytes_read"] >= total
        assert len(result["warnings"]) == 1, result["warnings"]
        assert "no backend for cpu" in result["warnings"][0]
        assert "cuda:gloo" in result["warnings"][0]


def test_a_group_with_several_backends_uses_the_targets(tmp_path, checkpoint):
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2,
                        {"copy": False, "chunk_size": 4096, "exchange": "always"},
                        backend="cpu:gloo,cuda:gloo")
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["warnings"] == []
    assert_read_once_in_shares(results, total, 2)


@pytest.mark.parametrize("backend", ["cuda:gloo", "cpu:gloo,cuda:gloo"])
def test_the_vllm_iterator_with_a_device_group(tmp_path, checkpoint, backend):
    # On a GPU machine vLLM passes its NCCL group and an int device; here the CPU target with a
    # group of the same shape ("cuda:gloo": local reads and a warning) or with a CPU backend too.
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {}, backend=backend, vllm=True)
    for rank, result in enumerate(results):
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert len(result["warnings"]) == (1 if backend == "cuda:gloo" else 0), result["warnings"]
        if rank == 0:
            [bar] = result["bars"]
            assert bar["total"] == total and bar["done"] == total
            assert bar["unit"] == "B" and bar["unit_scale"] and bar["unit_divisor"] == 1024
        else:
            assert result["bars"] == []  # one bar per load, on rank 0


def test_mismatched_files_raise_at_the_handshake_then_the_group_works(tmp_path, checkpoint):
    paths, expected, _ = checkpoint
    results = run_ranks(tmp_path, [paths, paths[:1]], {"copy": True}, retry=True,
                        retry_files=[paths, paths])
    for result in results:
        assert "ranks opened different checkpoints" in result.get("error", ""), result
        assert result["retry"].get("digests") == expected, result["retry"]


# auto: a host target reads alone (status rounds only), a staged one exchanges; never: the
# staged path reading alone; always: the host exchange.
# "rare": the default rounds (every GiB and at the end), so the failing rank meets the others at
# the end while they read on.
@pytest.mark.parametrize("world,staged,exchange,meet", [
    (2, False, "auto", "often"), (3, False, "auto", "often"), (2, False, "auto", "rare"),
    (2, False, "always", "often"), (3, True, "auto", "often"), (2, True, "never", "often")])
def test_an_injected_read_error_on_one_rank_raises_on_every_rank(tmp_path, checkpoint, world,
                                                                 staged, exchange, meet):
    paths, expected, _ = checkpoint
    # backend named: reads to inject into (a host iteration over views of the page cache has none).
    options = {"copy": True, "chunk_size": 4096, "_force_staging": staged, "exchange": exchange,
               "backend": "pread"}
    results = run_ranks(tmp_path, [paths] * world, options, timeout=120, fault_rank=1,
                        fault_read=3, testing_library=fault_library(), retry=True,
                        retry_files=[paths] * world, env=MEET_OFTEN if meet == "often" else {})
    assert "Input/output error" in results[1].get("error", ""), results[1]
    for rank, result in enumerate(results):
        assert result.get("error"), result
        if rank != 1:
            assert "rank 1 failed" in result["error"] and "Input/output error" in result["error"]
        assert result["retry"].get("digests") == expected, result["retry"]


@pytest.mark.parametrize("world,exchange", [(2, "auto"), (3, "auto"), (2, "always")])
def test_a_file_changed_on_one_rank_raises_on_every_rank(tmp_path, checkpoint, world, exchange):
    paths, expected, _ = checkpoint
    per_rank = copies_per_rank(tmp_path, paths, world)
    results = run_ranks(tmp_path, per_rank, {"copy": True, "exchange": exchange}, timeout=120,
                        break_rank=1)
    assert "changed since it was opened" in results[1]["error"], results[1]
    for rank, result in enumerate(results):
        if rank != 1:
            assert "rank 1 failed" in result.get("error", ""), result


def test_load_into_fills_every_destination_on_every_rank(tmp_path, checkpoint):
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"keys": None, "chunk_size": 4096}, into=True)
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["bytes_read"] == total  # each rank reads what it fills


def collectives_through_a_failure(tmp_path, checkpoint, failure, world, options, **spec):
    """Runs a load that fails as `failure` says ("read": a read error on rank 1; "changed": rank
    1's copy of a file changes after the handshake; None) and a retry, each rank recording its
    collectives (test-only INSTANTTENSOR_TESTING_TRACE_COLLECTIVES). Returns each rank's
    sequence and result."""
    paths, _, _ = checkpoint
    trace = str(tmp_path / "collectives")
    files = [paths] * world
    if failure == "read":
        spec.update(fault_rank=1, fault_read=3, testing_library=fault_library())
    elif failure == "changed":
        files = copies_per_rank(tmp_path, paths, world)
        spec.update(break_rank=1)
    results = run_ranks(tmp_path, files, options, timeout=120, retry=True,
                        retry_files=[paths] * world,
                        env={"INSTANTTENSOR_TESTING_TRACE_COLLECTIVES": trace, **MEET_OFTEN},
                        **spec)
    sequences = [open(f"{trace}.rank{rank}").read().splitlines() for rank in range(world)]
    return sequences, results


@pytest.mark.parametrize("failure,world,staged,exchange", [
    (None, 2, False, "always"), ("read", 2, False, "always"), ("read", 3, True, "auto"),
    ("changed", 2, False, "always"), ("changed", 3, True, "auto"),
    (None, 2, False, "auto"), ("read", 2, False, "auto"), ("read", 3, False, "auto"),
    ("changed", 3, False, "auto"), ("read", 2, True, "never"),
])
def test_every_rank_makes_the_same_collectives_in_the_same_order_whatever_fails(
        tmp_path, checkpoint, failure, world, staged, exchange):
    # The exchange protocol's promise: a failure on one rank changes what every rank does
    # (they all stop after the same status round), never the sequence of collectives, so no
    # rank waits in a collective the others skipped. Each rank records its collectives through a
    # failed load and a retry.
    _, expected, _ = checkpoint
    # backend named: reads to inject into (a host iteration over views of the page cache has none).
    options = {"copy": True, "chunk_size": 4096, "_force_staging": staged, "exchange": exchange,
               "backend": "pread"}
    sequences, results = collectives_through_a_failure(tmp_path, checkpoint, failure, world,
                                                       options)
    assert "handshake" in sequences[0] and "status" in sequences[0]
    if failure is None:  # ranks reading alone meet between tensors too, not only at the end
        assert sequences[0].count("status") >= 3, sequences[0]
    for rank in range(1, world):
        assert sequences[rank] == sequences[0], (rank, sequences[0], sequences[rank])
    for result in results:
        if failure:
            assert result.get("error"), result
            assert result["retry"].get("digests") == expected, result["retry"]
        else:
            assert result.get("digests") == expected, result


# -- the exchange by cost ----------------------------------------------------------------------

def assert_each_rank_read_everything(results, total, expected):
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["bytes_read"] == total  # read alone, each byte once
        assert result["stats"]["bytes_received"] == 0
        assert result["warnings"] == []


@pytest.mark.parametrize("world,copy", [(2, True), (2, False), (3, True)])
def test_ranks_on_one_host_read_alone_through_its_page_cache(tmp_path, checkpoint, world, copy):
    paths, expected, total = checkpoint
    options = {"copy": copy, "chunk_size": 4096}
    if not copy:
        options["buffer_size"] = 96 << 10  # the ring wraps several times
    results = run_ranks(tmp_path, [paths] * world, options)
    assert_each_rank_read_everything(results, total, expected)
    for result in results:
        assert result["stats"]["exchange"] == "none (one host, host target)"
        assert f"{world} ranks on this host" in result["stats"]["backend"]


def test_ranks_on_one_host_never_drop_the_page_cache_of_a_checkpoint_larger_than_memory(
        tmp_path):
    # Read alone, such a checkpoint's pages are dropped behind the consumer; ranks sharing a
    # host's page cache read it once in order only if none drops what another has not read yet.
    torch.manual_seed(5)
    tensors = {f"w{i}": torch.randn(1 << 20) for i in range(3)}  # 12 MiB, above 8 MiB of memory
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    results = run_ranks(tmp_path, [[path]] * 2, {"copy": True},
                        env={"INSTANTTENSOR_TESTING_MEMORY_BYTES": str(8 << 20)})
    assert_each_rank_read_everything(results, 12 << 20, {n: digest(t) for n, t in tensors.items()})
    for result in results:
        backend = result["stats"]["backend"]
        assert "read once: MADV_SEQUENTIAL" in backend and "DONTNEED" not in backend, backend


def test_each_ranks_debug_line_is_whole_and_names_its_rank(tmp_path, checkpoint):
    """vLLM's workers share one stderr: a line written in pieces would interleave with others.
    (The rank's name is checked every run; pieces interleave only when ranks close together.)"""
    paths, _, total = checkpoint
    log = tmp_path / "stderr.log"
    with open(log, "a") as shared:  # O_APPEND: each write lands whole at the end
        results = run_ranks(tmp_path, [paths] * 3, {"copy": True},
                            env={"INSTANTTENSOR_DEBUG": "1"}, stderr=shared)
    lines = [line for line in log.read_text().splitlines() if line.startswith("[instanttensor]")]
    assert len(lines) == 3, log.read_text()
    pattern = re.compile(r"\[instanttensor\] \S+ \(rank (\d) of 3\): (\d+) bytes in \d+ reads, "
                         r"wait \S+ s, read \S+ s, materializations \d+, copy owned, "
                         r"exchange: (.*)$")
    matches = [pattern.match(line) for line in lines]
    assert all(matches), lines
    assert sorted(int(m.group(1)) for m in matches) == [0, 1, 2]
    for m, result in zip(sorted(matches, key=lambda m: m.group(1)), results):
        assert int(m.group(2)) == result["stats"]["bytes_read"] >= total
        assert m.group(3) == result["stats"]["exchange"] == "none (one host, host target)"


def test_two_host_identities_each_rank_reads_everything(tmp_path, checkpoint):
    # Two "hosts" of two ranks each (test-only identities): a host target still reads alone.
    paths, expected, total = checkpoint
    hosts = {"0": "a", "1": "a", "2": "b", "3": "b"}
    results = run_ranks(tmp_path, [paths] * 4, {"copy": True},
                        rank_env={r: {"INSTANTTENSOR_TESTING_HOST_ID": h} for r, h in hosts.items()})
    assert_each_rank_read_everything(results, total, expected)
    for result in results:
        assert result["stats"]["exchange"] == (
            "none (several hosts, host target: each rank reads everything)")
        assert "2 ranks on this host" in result["stats"]["backend"]


def test_ranks_that_each_are_a_host_of_their_own_share_no_page_cache(tmp_path, checkpoint):
    paths, expected, total = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"copy": True},
                        rank_env={"0": {"INSTANTTENSOR_TESTING_HOST_ID": "a"},
                                  "1": {"INSTANTTENSOR_TESTING_HOST_ID": "b"}})
    assert_each_rank_read_everything(results, total, expected)
    for result in results:
        assert "ranks on this host" not in result["stats"]["backend"]


@pytest.mark.parametrize("exchange,staged,described", [
    ("always", False, "host (exchange=always)"),
    ("never", True, "none (exchange=never)"),
    ("auto", True, "device (device target)"),
])
def test_the_exchange_override(tmp_path, checkpoint, exchange, staged, described):
    paths, expected, total = checkpoint
    options = {"copy": True, "chunk_size": 4096, "_force_staging": staged,
               "staging_size": 32 << 10}
    results = run_ranks(tmp_path, [paths] * 2, options,
                        env={"INSTANTTENSOR_EXCHANGE": exchange.upper()})
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["exchange"] == described
    if exchange == "never":
        assert_each_rank_read_everything(results, total, expected)
    else:
        assert_read_once_in_shares(results, total, 2)


def test_ranks_that_disagree_on_the_exchange_raise_at_the_handshake(tmp_path, checkpoint):
    paths, _, _ = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"copy": True},
                        rank_options={"0": {"exchange": "always"}, "1": {"exchange": "auto"}})
    for result in results:
        assert "different checkpoints, selections or layout options" in result.get("error", "")
        assert "exchange" in result["error"]


def test_a_single_process_says_it_exchanged_nothing_and_a_bad_value_is_an_error(checkpoint,
                                                                                 monkeypatch):
    import instanttensor

    paths, _, _ = checkpoint
    with instanttensor.safe_open(paths) as f:
        assert f.stats()["exchange"] == "none (single process)"
    with pytest.raises(ValueError, match="exchange='sometimes'.*auto, always or never"):
        instanttensor.safe_open(paths, exchange="sometimes")
    monkeypatch.setenv("INSTANTTENSOR_EXCHANGE", "yes")
    with pytest.raises(ValueError, match="INSTANTTENSOR_EXCHANGE"):
        instanttensor.safe_open(paths)


def test_mapped_views_with_a_group_read_nothing(tmp_path, checkpoint):
    # mmap with copy=False: views of the mapping, as in one process (no ring, no reads).
    paths, expected, _ = checkpoint
    results = run_ranks(tmp_path, [paths] * 2, {"copy": False, "backend": "mmap"})
    for result in results:
        assert "error" not in result, result["error"]
        assert result["digests"] == expected
        assert result["stats"]["bytes_read"] == 0 and result["stats"]["materializations"] == 0
        assert result["stats"]["exchange"] == "none (one host, host target)"


def test_an_empty_selection_with_a_group_meets_once_and_ends(tmp_path, checkpoint):
    paths, _, _ = checkpoint
    trace = str(tmp_path / "collectives")
    results = run_ranks(tmp_path, [paths] * 2, {"keys": []},
                        env={"INSTANTTENSOR_TESTING_TRACE_COLLECTIVES": trace})
    for rank, result in enumerate(results):
        assert "error" not in result, result["error"]
        assert result["digests"] == {} and result["total"] == 0
        assert open(f"{trace}.rank{rank}").read().splitlines() == ["handshake", "status"]
