"""The read path (a named backend, random access, load_into) holds descriptors only for the shards
whose reads are in flight: a process whose descriptor table grows while it runs threads waits an
RCU grace period in the kernel (10-30 ms a crossing, benchmarks/README.md), and a checkpoint of
hundreds of shards would otherwise end its load holding one descriptor per shard."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes

SHARDS = 12
OPEN_KEPT = 2  # FileDescriptors::kOpenKept: idle descriptors a checkpoint keeps open


@pytest.fixture
def shards(tmp_path):
    """12 files of one 256 KiB tensor each, on a filesystem that takes O_DIRECT (not tmpfs)."""
    torch.manual_seed(35)
    tensors = {}
    for i in range(SHARDS):
        tensors[f"s{i:02d}"] = torch.randn(256, 256)
        reference_save({f"s{i:02d}": tensors[f"s{i:02d}"]}, str(tmp_path / f"m{i:02d}.safetensors"))
    return sorted(str(p) for p in tmp_path.iterdir()), tensors, str(tmp_path)


def skip_without_direct_io(f, backend: str) -> None:
    """The filesystem of the test's files refuses O_DIRECT (tmpfs before 6.6): only buffered."""
    description = f.stats()["backend"]
    wants_direct = backend in ("direct", "uring")
    if wants_direct and ("O_DIRECT" not in description or "refused" in description):
        pytest.skip(f"O_DIRECT is not available here ({description})")


def shard_descriptors(folder: str) -> int:
    """Descriptors of this process that name a file of `folder`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(folder + os.sep):
                count += 1
        except OSError:  # closed meanwhile (listdir's own descriptor)
            pass
    return count


@pytest.mark.parametrize("backend", ["pread", "direct", "uring"])
def test_a_pass_through_a_named_backend_holds_the_shards_it_is_reading(shards, backend):
    files, tensors, folder = shards
    # One shard's bytes ahead: reads of two or three shards are in flight at a time.
    with instanttensor.safe_open(files, backend=backend, buffer_size=512 << 10,
                                 concurrency=2) as f:
        most = 0
        for name, tensor in f.tensors():
            most = max(most, shard_descriptors(folder))
            assert same_bytes(tensor, tensors[name])
        skip_without_direct_io(f, backend)
        assert most <= 4, most  # 12 before: every shard's descriptor kept until close
        assert shard_descriptors(folder) <= OPEN_KEPT
    assert shard_descriptors(folder) == 0


def test_random_access_and_load_into_release_each_shard_after_its_reads(shards):
    files, tensors, folder = shards
    with instanttensor.safe_open(files, backend="direct") as f:
        for name in reversed(sorted(tensors)):
            assert same_bytes(f.get_tensor(name), tensors[name])
            assert shard_descriptors(folder) <= OPEN_KEPT
        destinations = {name: torch.empty_like(t) for name, t in tensors.items()}
        f.load_into(destinations)
        assert shard_descriptors(folder) <= OPEN_KEPT
    assert all(same_bytes(destinations[name], tensors[name]) for name in tensors)
    assert shard_descriptors(folder) == 0


@pytest.mark.parametrize("change", ["replaced", "grown", "pipe"])
def test_a_shard_changed_before_its_direct_reads_is_refused_naming_it_and_how(shards, change):
    # Its O_DIRECT descriptor is opened when its reads begin: checked to be the file validated at
    # open (as the buffered ones are), so a file replaced by rename (a named pipe included) or
    # rewritten in place meanwhile is never read, and the error says which, without waiting.
    files, tensors, folder = shards
    with instanttensor.safe_open(files, backend="direct", buffer_size=512 << 10,
                                 concurrency=1) as f:
        iterator = f.tensors()
        name, tensor = next(iterator)
        skip_without_direct_io(f, "direct")
        assert same_bytes(tensor, tensors[name])
        size = os.path.getsize(files[-1])
        if change == "replaced":
            replacement = os.path.join(folder, "replacement")
            reference_save({"s11": torch.zeros(256, 256)}, replacement)
            os.replace(replacement, files[-1])
            how = r"\(its path names another file\)"
        elif change == "grown":
            with open(files[-1], "ab") as grow:
                grow.write(b"\0" * 8)
            how = rf"\(size {size} -> {size + 8}\)"
        else:  # a named pipe's open would wait for a writer that never comes
            pipe = os.path.join(folder, "pipe")
            os.mkfifo(pipe)
            os.replace(pipe, files[-1])
            how = r"\(its path names another file\)"
        with pytest.raises(OSError, match="m11.safetensors.*changed since it was opened " + how):
            for name, tensor in iterator:
                assert same_bytes(tensor, tensors[name])


@pytest.mark.parametrize("backend", ["pread", "uring_buffered"])
def test_a_shard_replaced_after_its_reads_began_keeps_serving_the_validated_file(shards, backend):
    # Its descriptor is held until the consumer has moved past it: the checks after its reads go
    # by it, so the bytes of the file validated are served, as safetensors serves its mapping.
    # (O_DIRECT reads hold no buffered descriptor: their checks go by the path, as before.)
    files, tensors, folder = shards
    # The whole checkpoint read ahead at once: every shard's reads began at the first step.
    with instanttensor.safe_open(files, backend=backend, concurrency=1) as f:
        iterator = f.tensors()
        name, tensor = next(iterator)
        skip_without_direct_io(f, backend)
        replacement = os.path.join(folder, "replacement")
        reference_save({"s11": torch.zeros(256, 256)}, replacement)
        os.replace(replacement, files[-1])
        loaded = dict(iterator)
        loaded[name] = tensor
    assert all(same_bytes(loaded[name], tensors[name]) for name in tensors)
