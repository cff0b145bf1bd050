"""The loader's timeline (INSTANTTENSOR_TIMELINE=1, safe_open.timeline()) and the benchmark's
reading of it (benchmarks/pipeline_timeline.py): the events account for every read, slice and
copy of a staged pass, lie inside the pass, and the analysis attributes idle time as stated."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
import simulated_device as simdev

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import pipeline_timeline  # noqa: E402


def _checkpoint(tmp_path, count=12, numel=96 << 10):
    tensors = {f"w{i}": torch.randn(numel, generator=torch.Generator().manual_seed(i))
               for i in range(count)}
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    return path, tensors


def test_the_timeline_is_empty_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("INSTANTTENSOR_TIMELINE", raising=False)
    path, _ = _checkpoint(tmp_path, count=2)
    with instanttensor.safe_open(path, framework="pt") as f:
        list(f.tensors())
        assert f.timeline() == []


@pytest.mark.parametrize("copy", [True, False])
def test_a_staged_pass_records_every_read_slice_and_copy(tmp_path, monkeypatch, copy):
    monkeypatch.setenv("INSTANTTENSOR_TIMELINE", "1")
    path, tensors = _checkpoint(tmp_path)
    before = time.monotonic()
    # A ring of two 384 KiB tensors: slices wait for copies, the ring fills.
    with instanttensor.safe_open(path, framework="pt", _force_staging=True, copy=copy,
                                 staging_size=1 << 20, concurrency=2) as f:
        for name, tensor in f.tensors():
            assert torch.equal(tensor, tensors[name])
        stats = f.stats()
    after = time.monotonic()
    events = f.timeline()  # kept after close
    kinds = Counter(e["kind"] for e in events)
    assert kinds["open"] == 1
    assert kinds["tensor_out"] == len(tensors)
    for e in events:
        assert before <= e["start"] <= e["end"] <= after, e
    # Every piece submitted was read and booked, under the same tags and bytes.
    submitted = sorted((e["tag"], e["bytes"]) for e in events if e["kind"] == "read_submitted")
    read = sorted((e["tag"], e["bytes"]) for e in events if e["kind"] == "read")
    booked = sorted((e["tag"], e["bytes"]) for e in events if e["kind"] == "read_booked")
    assert submitted == read == booked
    assert sum(b for _, b in read) == stats["bytes_read"]
    assert len(read) == stats["read_requests"]
    # One slice per staged read, each copied once; freed as the pass goes on, but for those the
    # ring still held at the end (freed by the close, not the pass).
    placed = [e for e in events if e["kind"] == "staging_placed"]
    queued = [e for e in events if e["kind"] == "copy_queued"]
    freed = [e for e in events if e["kind"] == "staging_freed"]
    assert placed and len(placed) == len(queued) >= len(freed)
    assert 0 < sum(e["bytes"] for e in placed) - sum(e["bytes"] for e in freed) <= 1 << 20
    assert sum(e["bytes"] for e in queued) == sum(t.nbytes for t in tensors.values())
    assert max(in_use for _, in_use in pipeline_timeline._staging_steps(events)) <= 1 << 20
    # The ring held two tensors at most: later reads waited for a slice.
    assert kinds["staging_full"] > 0
    open_end = next(e["end"] for e in events if e["kind"] == "open")
    assert all(e["start"] >= open_end for e in placed)


@pytest.mark.skipif(not simdev.load(), reason="needs the simulated device")
def test_the_copy_engine_log_matches_the_copies_queued(tmp_path, monkeypatch):
    monkeypatch.setenv("INSTANTTENSOR_TIMELINE", "1")
    path, tensors = _checkpoint(tmp_path)
    simdev.set_timing(1.0, 1.0, 10)
    try:
        simdev.reset_engine_stats()
        with instanttensor.safe_open(path, framework="pt", device="simdev:0",
                                     staging_size=1 << 20) as f:
            got = {name: t.cpu() for name, t in f.tensors()}
        torch.ops.simdev.synchronize(0)
        log = simdev.engine_log(0, True)
    finally:
        simdev.set_timing(0, 0, 0)
    assert all(torch.equal(got[n], tensors[n]) for n in tensors)
    queued = [e for e in f.timeline() if e["kind"] == "copy_queued"]
    copies = log  # host to device only: the reads back by .cpu() are the other engine
    assert len(copies) == len(queued)
    assert sum(c[2] for c in copies) == sum(e["bytes"] for e in queued)
    # A copy runs after it was queued, one at a time on the engine.
    for (start, end, nbytes), event in zip(copies, queued):
        assert start >= event["start"] - 1e-6
    for previous, following in zip(copies, copies[1:]):
        assert following[0] >= previous[1] - 1e-9


@pytest.mark.skipif(not simdev.load(), reason="needs the simulated device")
def test_a_staged_pass_uses_the_staging_ring_only_up_to_its_limit(tmp_path, monkeypatch):
    # Copies slower than the reads, so slices queue up for the engine: the ring still holds only
    # what the two workers, a read queued behind each and two copies need (2 + 2 + 2 slots of
    # 64 KiB + 12 KiB of O_DIRECT room); the rest of the 1 MiB ring is never touched.
    monkeypatch.setenv("INSTANTTENSOR_TIMELINE", "1")
    path, tensors = _checkpoint(tmp_path)
    simdev.set_timing(0.05, 0.05, 10)
    try:
        with instanttensor.safe_open(path, framework="pt", device="simdev:0", concurrency=2,
                                     staging_size=1 << 20, chunk_size=64 << 10) as f:
            got = {name: t.cpu() for name, t in f.tensors()}
    finally:
        simdev.set_timing(0, 0, 0)
    assert all(torch.equal(got[n], tensors[n]) for n in tensors)
    events = f.timeline()
    limits = [e["bytes"] for e in events if e["kind"] == "staging_limit"]
    assert limits == [6 * (76 << 10)]
    peak = max(in_use for _, in_use in pipeline_timeline._staging_steps(events))
    assert 2 * (64 << 10) <= peak <= limits[0]


def _sample(reads, engine, opened=(0.0, 1.0), staging=(), ring=0, end=10.0):
    events = [{"kind": "open", "start": opened[0], "end": opened[1], "bytes": 0, "tag": 0}]
    events += [{"kind": "read", "start": s, "end": e, "bytes": 1, "tag": 0} for s, e in reads]
    events += [{"kind": kind, "start": t, "end": t, "bytes": b, "tag": 0} for t, kind, b in staging]
    return {"timeline": events, "engine_log": [(s, e, 1) for s, e in engine],
            "pass_start": 0.0, "pass_end": end, "staging_bytes": ring}


def test_the_analysis_splits_the_disks_idle_time_by_cause():
    # Reads 1-4 and 6-8 (two overlapping in 1-4), the ring full from 4 to 6, copies 2-9.5.
    sample = _sample(reads=[(1, 3), (2, 4), (6, 8)], engine=[(2, 9.5)],
                     staging=[(1, "staging_placed", 60), (2, "staging_placed", 40),
                              (6, "staging_freed", 60), (6, "staging_placed", 60)], ring=100)
    a = pipeline_timeline.analyse(sample)
    assert a["open_s"] == pytest.approx(1.0)
    assert a["disk_busy"] == pytest.approx(0.5)
    assert a["reads_in_calls_mean"] == pytest.approx(6 / 5)
    assert a["engine_busy"] == pytest.approx(0.75)
    assert a["disk_idle"] == pytest.approx({"open": 0.1, "ring full": 0.2, "tail": 0.2,
                                            "other": 0.0})
    assert a["bound_by"].startswith("copy engine 75% busy")
    # The engine busy 95% of the pass: it is the bound.
    busy = pipeline_timeline.analyse(_sample(reads=[(1, 2)], engine=[(0.5, 10)]))
    assert busy["bound_by"] == "copy engine"
    # A gap with room in the ring is a read that could have been submitted.
    gap = pipeline_timeline.analyse(_sample(reads=[(1, 5), (7, 10)], engine=[],
                                            staging=[(1, "staging_placed", 10)], ring=100))
    assert gap["disk_idle"]["other"] == pytest.approx(0.2)
    # The same gap with the ring's limit at 15 then: the ring was full up to its limit.
    limited = pipeline_timeline.analyse(_sample(
        reads=[(1, 5), (7, 10)], engine=[],
        staging=[(0.5, "staging_limit", 15), (1, "staging_placed", 10), (8, "staging_limit", 90)],
        ring=100))
    assert limited["disk_idle"]["ring full"] == pytest.approx(0.2)
