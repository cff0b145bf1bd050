"""Host iteration through views of the page cache: during its step a tensor is a view of the
file's private mapping; one the consumer still holds when the pass moves on is copied into owned
memory (its storage repointed, so views of it follow), so after its step a kept tensor never
changes whatever happens to the file, and a consumer that copies and drops pays no copy of ours."""

from __future__ import annotations

import gc
import json
import mmap
import os
import re
import threading
import time

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes
from test_distributed import fault_library
from test_fork import in_child

COPIES = [True, False]  # a borrowed view too is copied out if held when the iteration moves on


@pytest.fixture(params=["leased", "copied", "copied out"])
def kept_as(request, monkeypatch):
    """How a view kept past its step is kept: under a read lease on its file (its pages replaced
    by private copies when a writer comes), or copied at once where the kernel refuses the lease
    (INSTANTTENSOR_TESTING_NO_LEASE=1 plays that refusal): where it is (1 MiB or more), or out
    into owned memory, its storage repointed (a smaller view, or past the process's cap on
    views copied where they are, which "copied out" sets to 0)."""
    if request.param == "leased" and not _a_lease_is_granted(request.getfixturevalue("tmp_path")):
        # Run as root on a local filesystem (CI), a test of leases that cannot take one fails:
        # it would pass on the copy path and test nothing of leases.
        if os.environ.get("INSTANTTENSOR_REQUIRE_LEASES") == "1":
            pytest.fail("no read lease is granted here, where one is required")
        pytest.skip("this filesystem or process gets no read lease")
    if request.param != "leased":
        monkeypatch.setenv("INSTANTTENSOR_TESTING_NO_LEASE", "1")
    if request.param == "copied out":
        monkeypatch.setenv("INSTANTTENSOR_TESTING_VIEWS_COPIED_AT_ONCE_MAX", "0")
    return request.param


def _a_lease_is_granted(directory) -> bool:
    """Whether the kernel grants this process a read lease on a file of `directory`."""
    import fcntl

    path = directory / "lease-probe"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETLEASE", 1024), fcntl.F_RDLCK)
        fcntl.fcntl(fd, getattr(fcntl, "F_SETLEASE", 1024), fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        path.unlink()


def _expect_kept(stats: dict, kept_as: str, leased: int, copied: int) -> None:
    """The views kept past their step: `leased` under a lease, or `copied` copied out where the
    lease is refused (one fewer when the last one was read into owned memory beside the pass)."""
    expected = (leased, 0) if kept_as == "leased" else (0, copied)
    assert (stats["leased_views"], stats["materializations"]) == expected


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(33)
    tensors = {f"t{i:02d}": torch.randn(256, 1024) for i in range(12)}  # 1 MiB each
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    return path, tensors


def _data_start(path: str) -> int:
    with open(path, "rb") as file:
        return 8 + int.from_bytes(file.read(8), "little")


def _rewrite_in_place(path: str) -> None:
    """Same size, every tensor byte changed: what an in-place writer leaves."""
    start = _data_start(path)
    size = os.path.getsize(path)
    with open(path, "r+b") as file:
        file.seek(start)
        file.write(b"\x7f" * (size - start))


def _resident_kb_of_mappings_of(path: str) -> int:
    """Resident pages of this process's mappings of one file, from /proc/self/smaps: the
    process-wide RssFile also counts other files' pages touched meanwhile (CI once saw it 51 MiB up
    where this file's mapping holds 28)."""
    target = os.path.realpath(path)  # smaps names a mapping by its resolved path
    total = 0
    in_file = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's first line: range perms ... path
                in_file = " ".join(fields[5:]) == target
            elif in_file and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_stats_say_views_and_a_dropping_consumer_costs_no_copy(checkpoint):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, concurrency=2) as f:
        assert "views of the page cache" in f.stats()["backend"]
        destination = {}
        for name, tensor in f.tensors():
            destination[name] = tensor.clone()  # the consumer's copy, then it drops the view
        stats = f.stats()
    assert stats["materializations"] == 0
    assert stats["bytes_read"] == sum(t.nbytes for t in tensors.values())
    assert all(same_bytes(destination[n], tensors[n]) for n in tensors)


@pytest.mark.parametrize("copy", COPIES)
def test_during_its_step_a_tensor_is_a_view_of_the_file(checkpoint, copy):
    # Zero-copy: two tensors of one file lie as far apart in memory as in the file. The last
    # tensor is read into owned memory (the loop still binds it when the pass ends).
    path, tensors = checkpoint
    with open(path, "rb") as file:
        file.seek(8)
        header = json.loads(file.read(_data_start(path) - 8))
    offsets = {n: header[n]["data_offsets"][0] for n in tensors}
    with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
        pointers = {name: tensor.data_ptr() for name, tensor in f.tensors()}
        assert f.stats()["materializations"] == 0
    names = sorted(tensors, key=offsets.get)[:-1]
    for a, b in zip(names, names[1:]):
        assert pointers[b] - pointers[a] == offsets[b] - offsets[a], (a, b)


def test_a_borrowed_pass_over_views_holds_no_ring(checkpoint):
    # buffer_size is only the read-ahead window: below the largest tensor (a ring would refuse
    # it) the pass still runs, and by default it is copy=True's window, not a ring's size.
    path, tensors = checkpoint
    with instanttensor.safe_open(path, copy=False, buffer_size=64 << 10, concurrency=2) as f:
        got = {name: tensor.clone() for name, tensor in f.tensors()}
        assert "views of the page cache" in f.stats()["backend"]
    assert all(same_bytes(got[n], tensors[n]) for n in tensors)
    with instanttensor.safe_open(path, copy=False) as f, instanttensor.safe_open(path) as g:
        assert f.buffer_size == g.buffer_size


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("change", ["rewrite", "truncate", "delete"])
def test_kept_tensors_are_owned_once_the_pass_moves_on(checkpoint, copy, change, kept_as):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
        iteration = f.tensors()
        first_name, first = next(iteration)
        row = first[3]  # a view of the kept tensor follows it when it is copied out
        next(iteration)
        next(iteration)  # the pass moved past the first tensor: leased or copied now
        _expect_kept(f.stats(), kept_as, leased=1, copied=1)
        if change == "rewrite":
            _rewrite_in_place(path)
        elif change == "truncate":
            os.truncate(path, _data_start(path))
        else:
            os.unlink(path)
        assert same_bytes(first, tensors[first_name])  # no SIGBUS, no new bytes
        assert torch.equal(row, tensors[first_name][3])
        if change != "delete":
            with pytest.raises(OSError, match="changed since it was opened"):
                next(iteration)
    assert same_bytes(first, tensors[first_name])


@pytest.mark.parametrize("copy", COPIES)
def test_views_held_at_close_are_owned_after_it(checkpoint, copy, kept_as):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
        kept = dict(f.tensors())  # the last one is still a view when the pass ends
        # Copied: the last one (1 MiB) was read into owned memory beside the pass instead.
        _expect_kept(f.stats(), kept_as, leased=len(tensors), copied=len(tensors) - 1)
    os.truncate(path, 0)
    assert all(same_bytes(kept[n], tensors[n]) for n in tensors)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small_shards(tmp_path, monkeypatch):
    """12 files of one 16 KiB tensor each: no last tensor large enough to be read owned, so a
    file's lease is asked for only when a view of it is first kept (views this small are leased
    only in this testing build's setting; by default they are copied)."""
    monkeypatch.setenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES", "0")
    torch.manual_seed(34)
    shards = {}
    for i in range(12):
        shards[f"s{i:02d}"] = torch.randn(64, 64)
        reference_save({f"s{i:02d}": shards[f"s{i:02d}"]}, str(tmp_path / f"m{i:02d}.safetensors"))
    return sorted(str(p) for p in tmp_path.iterdir()), shards


def test_a_checkpoint_of_many_shards_holds_few_descriptors(small_shards, kept_as):
    # Descriptors held for every shard at once (and a lease's own for each) grow the process's
    # descriptor table, and growing it costs a threaded process an RCU grace period (10-30 ms,
    # vLLM's tiny model). Shards are held while read, and a lease only for a file whose view is
    # kept past its step.
    files, shards = small_shards
    with instanttensor.safe_open(files) as f:  # the process's own first-use descriptors
        dict(f.tensors())
    gc.collect()  # leased views of earlier tests in reference cycles close their leases now
    before = _open_descriptors()
    open_kept = 2  # FileDescriptors::kOpenKept
    with instanttensor.safe_open(files, concurrency=2) as f:
        assert _open_descriptors() - before <= open_kept
        kept, most = {}, 0
        for name, tensor in f.tensors():
            most = max(most, _open_descriptors() - before)
            if name == "s04":
                kept[name] = tensor  # a second file's view kept: the loop keeps the last one
        leases = 2 if kept_as == "leased" else 0
        _expect_kept(f.stats(), kept_as, leased=2, copied=2)
        # the files of the last two views handed out (the one before is checked at the next
        # step), and s04's lease
        assert most <= open_kept + 1
        assert leases <= _open_descriptors() - before <= open_kept + leases
        assert same_bytes(kept["s04"], shards["s04"]) and same_bytes(tensor, shards["s11"])
    del kept, tensor
    assert _open_descriptors() == before


def test_a_small_kept_view_is_copied_out_and_takes_no_lease(small_shards, monkeypatch):
    # A lease costs a descriptor; a copy of 16 KiB costs microseconds (vLLM keeps the norms of a
    # tiny model: four leases crossed 64 descriptors, a 14 ms step of a 20-30 ms load).
    monkeypatch.delenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES")
    files, shards = small_shards
    gc.collect()
    before = _open_descriptors()
    with instanttensor.safe_open(files) as f:
        kept = {name: tensor for name, tensor in f.tensors() if name in ("s02", "s04", "s07")}
        assert (f.stats()["leased_views"], f.stats()["materializations"]) == (0, 4)  # and s11
        assert _open_descriptors() - before <= 2  # FileDescriptors::kOpenKept
    for name, tensor in kept.items():
        assert same_bytes(tensor, shards[name])
    with open(files[4], "r+b") as rewrite:  # a writer never waits: nothing is leased
        rewrite.seek(-16, os.SEEK_END)
        rewrite.write(b"\0" * 16)
    assert same_bytes(kept["s04"], shards["s04"])


def test_small_views_kept_together_share_their_file_s_lease(tmp_path, kept_as):
    # A consumer that keeps every small tensor (load_file) takes one lease for the file from its
    # second kept view on: the first is copied out, the rest stay views.
    torch.manual_seed(35)
    tensors = {f"w{i}": torch.randn(4096) for i in range(4)}
    path = str(tmp_path / "small.safetensors")
    reference_save(tensors, path)
    with instanttensor.safe_open(path) as f:
        kept = dict(f.tensors())
        expected = (3, 1) if kept_as == "leased" else (0, 4)
        assert (f.stats()["leased_views"], f.stats()["materializations"]) == expected
    for name, tensor in tensors.items():
        assert same_bytes(kept[name], tensor)


def test_a_file_rewritten_during_a_step_is_reported_when_the_pass_moves_on(small_shards, kept_as):
    # The view is kept (its lease first asked for) after the write: the check that follows the
    # lease sees the file changed, and the step says so rather than keep the new bytes.
    files, _ = small_shards
    with instanttensor.safe_open(files) as f:
        iteration = f.tensors()
        _, first = next(iteration)
        time.sleep(0.05)  # past the filesystem's timestamp tick, so the write shows in mtime
        _rewrite_in_place(files[0])
        next(iteration)  # another file's tensor; the loop still binds the first one
        with pytest.raises(OSError, match="changed since it was opened"):
            next(iteration)  # the first one kept: its lease asked for, then the check


def test_a_forked_child_takes_no_lease_of_its_own(small_shards, kept_as):
    # The parent asked for no lease before the fork (nothing kept yet): the child's kept views
    # are copied out, as those of a file the parent leased are (its lease answers the parent).
    files, shards = small_shards
    with instanttensor.safe_open(files) as f:

        def child():
            kept = dict(f.tensors())
            assert all(same_bytes(kept[n], shards[n]) for n in shards)
            stats = f.stats()
            return f"{stats['leased_views']} {stats['materializations']}"

        status, said = in_child(child)
        assert status == 0 and said == f"0 {len(shards)}", said
        kept = dict(f.tensors())
        _expect_kept(f.stats(), kept_as, leased=len(shards), copied=len(shards))
    assert all(same_bytes(kept[n], shards[n]) for n in shards)


@pytest.mark.parametrize("copy", COPIES)
def test_a_tensor_handed_to_another_thread_stays_right(checkpoint, copy, kept_as):
    # The other thread reads it while the pass goes on (after the pass moved past it, when it was
    # kept), and again after the file is rewritten.
    path, tensors = checkpoint
    handed = []
    read_now = threading.Semaphore(0)
    done_reading = threading.Semaphore(0)
    results = []

    def other_thread():
        for _ in range(2):
            read_now.acquire()
            name, tensor = handed[0]
            results.append(same_bytes(tensor, tensors[name]))
            done_reading.release()

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
            iteration = f.tensors()
            handed.append(next(iteration))
            for step, _ in enumerate(iteration):
                if step == 2:  # the pass is two tensors past the one handed over
                    read_now.release()
                    done_reading.acquire()
            # The tensor handed over, and the last one, which `_` still binds at the pass's end
            # (copied: read into owned memory beside the pass instead).
            _expect_kept(f.stats(), kept_as, leased=2, copied=1)
            _rewrite_in_place(path)
    finally:
        read_now.release()
        thread.join()
    assert results == [True, True]


@pytest.mark.parametrize("copy", COPIES)
def test_an_in_place_write_on_a_view_stays_private(checkpoint, copy):
    path, tensors = checkpoint
    with open(path, "rb") as file:
        before = file.read()
    with instanttensor.safe_open(path, copy=copy) as f:
        for name, tensor in f.tensors():
            tensor.add_(1)
            assert torch.equal(tensor, tensors[name] + 1)
    with open(path, "rb") as file:
        assert file.read() == before


@pytest.mark.parametrize("copy", COPIES)
def test_a_checkpoint_larger_than_the_read_ahead_window_keeps_resident_memory_bounded(tmp_path,
                                                                                   copy):
    tensors = {f"w{i:02d}": torch.full((1 << 20,), float(i)) for i in range(32)}  # 128 MiB
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    with open(path, "rb") as file:  # warm: population is quick, so only unmapping bounds it
        while file.read(64 << 20):
            pass
    peak = 0
    with instanttensor.safe_open(path, copy=copy, buffer_size=16 << 20, concurrency=2) as f:
        for name, tensor in f.tensors():
            assert tensor[-1].item() == float(int(name[1:]))
            peak = max(peak, _resident_kb_of_mappings_of(path))
        assert f.stats()["materializations"] == 0
    # The window (16 MiB) and the two views a step may hold (8 MiB), far below the file's 128 MiB.
    assert 0 < peak < 48 * 1024, peak  # 0: the mapping was not found, nothing was measured


def _vm_flags_of_mappings_of(path: str) -> list[tuple[int, int, set[str]]]:
    """(start, end, VmFlags) of each of this process's mappings of one file (/proc/self/smaps)."""
    target = os.path.realpath(path)
    found = []
    span = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                span = (start, end) if " ".join(fields[5:]) == target else None
            elif span and fields[0] == "VmFlags:":
                found.append((*span, set(fields[1:])))
    return found


@pytest.mark.parametrize("copy", COPIES)
def test_a_checkpoint_larger_than_half_of_memory_is_read_once(tmp_path, monkeypatch, copy):
    # Such a checkpoint cannot stay cached beside the weights loaded from it: its mapping is
    # advised MADV_SEQUENTIAL ("sr" in smaps), so the pages it unmaps are not promoted to the
    # kernel's active list. The views the consumer keeps are its weights (their references
    # count): the mapping is advised back, whole, when the pass ends; never per view, which
    # would split it into one kernel map area per kept view (vm.max_map_count). A smaller
    # checkpoint keeps the kernel's recency, to stay cached.
    tensors = {f"w{i:02d}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    for memory, read_once in ((24 << 20, True), (64 << 20, False)):
        monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(memory))
        kept = None
        with instanttensor.safe_open(path, copy=copy) as f:
            for name, tensor in f.tensors():
                assert tensor[-1].item() == float(int(name[1:])), name
                kept = tensor if kept is None else kept  # w00, kept past its step
                mappings = _vm_flags_of_mappings_of(path)
                assert len(mappings) == 1, mappings  # one area: no view split it
                assert ("sr" in mappings[0][2]) == read_once, (name, memory, mappings)
            backend = f.stats()["backend"]
            assert f.stats()["leased_views"] == 2  # w00, and w03 the loop still binds
            mappings = _vm_flags_of_mappings_of(path)
            assert len(mappings) == 1 and "sr" not in mappings[0][2], mappings
        assert ("read once: MADV_SEQUENTIAL" in backend) == read_once, backend
        assert same_bytes(kept, tensors["w00"])


def _cached_share(path: str, start: int, length: int) -> float:
    """Share of the pages of [start, start + length) of the file in the page cache (mincore over a
    mapping of its own, never touched)."""
    import ctypes

    from instanttensor._demo_bench import _libc

    libc = _libc()
    page = mmap.PAGESIZE
    first, end = start // page * page, start + length
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, end - first, mmap.PROT_READ, mmap.MAP_SHARED, fd, first)
        assert address not in (None, ctypes.c_void_p(-1).value)
        pages = (end - first + page - 1) // page
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(address, end - first, vector) == 0
        libc.munmap(address, end - first)
        return sum(v & 1 for v in vector) / pages
    finally:
        os.close(fd)


def _largest_folio_bytes() -> int:
    # What the loader's drop ranges end at multiples of (io::largest_folio_bytes): the kernel's
    # PMD size, 2 MiB on x86-64, more on arm64 with 16 or 64 KiB pages; the page size without THP.
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as stated:
            return int(stated.read())
    except (OSError, ValueError):
        return mmap.PAGESIZE


def _no_launcher_beside(monkeypatch) -> None:
    """This process alone on its host, as the loader judges it, even when the suite itself runs
    under torchrun or mpirun."""
    for variable in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(variable, raising=False)


def _evict_or_skip(paths: list[str]) -> None:
    """Drops `paths` from the page cache, or skips the test where its folder keeps them (tmpfs)."""
    from instanttensor._demo_bench import evict

    if evict(paths) > 0.5:
        pytest.skip("the page cache of the test's folder cannot be dropped (tmpfs)")


@pytest.mark.parametrize("copy", COPIES)
def test_a_checkpoint_larger_than_memory_read_alone_leaves_the_page_cache_behind(tmp_path,
                                                                                  monkeypatch,
                                                                                  copy):
    # Larger than memory, no next load finds it cached: the pages behind the consumer are
    # dropped from the page cache as they are unmapped (POSIX_FADV_DONTNEED), a kept view's
    # excepted (mapped pages are never dropped). Between half of memory and memory, they stay.
    from instanttensor._demo_bench import evict

    tensors = {f"w{i:02d}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    _evict_or_skip([path])
    with open(path, "rb") as file:
        header = json.loads(file.read(_data_start(path))[8:])
    at = {n: (_data_start(path) + header[n]["data_offsets"][0], tensors[n].nbytes) for n in tensors}
    _no_launcher_beside(monkeypatch)
    for memory, dropped in ((12 << 20, True), (24 << 20, False)):
        monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(memory))
        kept = None
        with instanttensor.safe_open(path, copy=copy) as f:
            for name, tensor in f.tensors():
                assert same_bytes(tensor, tensors[name]), name  # every page read
                kept = tensor if kept is None else kept  # w00, kept past its step
                if name == "w03":  # w01 is behind the consumer: unmapped
                    # Its pages sharing no folio with a neighbour (a read-once mapping's folios
                    # are 2 MiB here: one holding a page of w00, kept, or of w02, held, stays).
                    begin, length = at["w01"]
                    unit = _largest_folio_bytes()
                    inner = (begin + unit - 1) // unit * unit, (begin + length) // unit * unit
                    if inner[1] > inner[0]:  # none where folios are larger than w01
                        share = _cached_share(path, inner[0], inner[1] - inner[0])
                        assert share == (0.0 if dropped else 1.0), share
                    assert _cached_share(path, *at["w02"]) == 1.0  # the loop still binds it
                    if f.stats()["leased_views"]:  # w00 kept as a view: its pages are mapped
                        assert _cached_share(path, *at["w00"]) == 1.0
            backend = f.stats()["backend"]
        assert ("POSIX_FADV_DONTNEED behind" in backend) == dropped, backend
        assert "read once: MADV_SEQUENTIAL" in backend, backend
        assert same_bytes(kept, tensors["w00"])
        evict([path])


def test_a_checkpoint_read_once_is_advised_ahead_and_one_kept_cached_is_populated(tmp_path,
                                                                                 monkeypatch):
    # Read once (above half of memory) and kept cached, the mapping takes 2 MiB folios and the
    # workers advise the window's reads (MADV_WILLNEED), the consumer's faults mapping the pages;
    # below half of memory, 4 KiB pages populated (MADV_POPULATE_READ, where the kernel has it).
    # The bytes are right either way.
    from instanttensor._demo_bench import evict

    tensors = {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    _no_launcher_beside(monkeypatch)
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    populate = bool(release) and tuple(map(int, release.groups())) >= (5, 14)
    for memory, method in ((24 << 20, "MADV_WILLNEED, "),
                           (64 << 20, "MADV_POPULATE_READ, " if populate else "MADV_WILLNEED, ")):
        _evict_or_skip([path])
        monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(memory))
        with instanttensor.safe_open(path) as f:
            assert all(same_bytes(t, tensors[n]) for n, t in f.tensors())
            backend = f.stats()["backend"]
        read_once = "read once: MADV_SEQUENTIAL, MADV_HUGEPAGE" in backend  # 2 MiB folios
        assert method in backend and read_once == (memory < 32 << 20), backend
    evict([path])


def test_a_checkpoint_larger_than_memory_in_two_files_drops_each_files_pages(tmp_path,
                                                                           monkeypatch):
    # The ranges dropped behind the consumer are per file: the first file's inner pages leave
    # the page cache while the second is read, and the second's pages behind leave it too.
    tensors = {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(6)}  # 24 MiB
    paths = [str(tmp_path / f"part{p}.safetensors") for p in range(2)]
    reference_save({n: tensors[n] for n in ("w0", "w1", "w2")}, paths[0])
    reference_save({n: tensors[n] for n in ("w3", "w4", "w5")}, paths[1])
    page = mmap.PAGESIZE
    inner = {}  # pages of each tensor shared with no neighbour, read before the eviction
    for path in paths:
        start = _data_start(path)
        with open(path, "rb") as file:
            for name, entry in json.loads(file.read(start)[8:]).items():
                begin, end = entry["data_offsets"]
                first = (start + begin + page - 1) // page * page
                inner[name] = (path, first, (start + end) // page * page - first)
    _evict_or_skip(paths)

    _no_launcher_beside(monkeypatch)
    monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(16 << 20))
    seen = {}
    with instanttensor.safe_open(paths) as f:
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name]), name
            if name == "w5":  # w0, w1 (first file) and w3 (second) are behind the consumer
                seen = {n: _cached_share(*inner[n]) for n in ("w0", "w1", "w3")}
        backend = f.stats()["backend"]
    assert "POSIX_FADV_DONTNEED behind" in backend, backend
    assert seen == {"w0": 0.0, "w1": 0.0, "w3": 0.0}, seen


def test_tensors_cut_across_large_folios_leave_no_page_cached_behind(tmp_path, monkeypatch):
    # A read-once mapping's folios are 2 MiB: tensors of 3 MiB + 4 KiB end inside them. Each
    # range dropped behind the consumer ends at a folio's edge, so the next one covers the folio
    # a tensor boundary cut, and nothing before the last tensor's folio stays cached once the
    # pass has ended (a range ending mid-folio left that folio cached for good:
    # POSIX_FADV_DONTNEED drops whole folios only). The last tensor, which the loop still binds
    # when the pass ends, is kept: its folios stay.
    elements = (3 << 20) // 4 + 1024
    tensors = {f"w{i}": torch.full((elements,), float(i)) for i in range(5)}  # 15 MiB + 20 KiB
    path = str(tmp_path / "cut.safetensors")
    reference_save(tensors, path)
    with open(path, "rb") as file:  # read before the eviction: reading caches the first pages
        header = json.loads(file.read(_data_start(path))[8:])
    start = (_data_start(path) + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    unit = _largest_folio_bytes()
    if unit != 2 << 20:
        pytest.skip(f"the tensors are sized for 2 MiB folios; this kernel's are {unit} bytes")
    last = (_data_start(path) + header["w4"]["data_offsets"][0]) // unit * unit
    _evict_or_skip([path])
    _no_launcher_beside(monkeypatch)
    monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(12 << 20))
    with instanttensor.safe_open(path) as f:
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name]), name
        backend = f.stats()["backend"]
        share = _cached_share(path, start, last - start)  # the first page to 12 MiB
    assert "POSIX_FADV_DONTNEED behind" in backend, backend
    assert share == 0.0, share


@pytest.mark.parametrize("variable", ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_a_process_a_launcher_started_beside_others_drops_no_page_cache(tmp_path, monkeypatch,
                                                                         variable):
    # torchrun or MPI replicas given no process group share the host's page cache: pages one of
    # them drops, another may not have read yet. Only the launcher's count says they exist.
    from instanttensor._demo_bench import evict

    tensors = {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    _evict_or_skip([path])
    _no_launcher_beside(monkeypatch)
    monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(12 << 20))
    for local_size, dropped in (("2", False), ("1", True)):
        monkeypatch.setenv(variable, local_size)
        with instanttensor.safe_open(path) as f:
            assert all(same_bytes(t, tensors[n]) for n, t in f.tensors())
            backend = f.stats()["backend"]
        assert "read once: MADV_SEQUENTIAL" in backend, backend
        assert ("POSIX_FADV_DONTNEED behind" in backend) == dropped, (local_size, backend)
        if not dropped:  # every page read stays cached for the neighbours
            assert _cached_share(path, _data_start(path), 16 << 20) == 1.0
        evict([path])


def test_a_small_cold_checkpoint_is_fetched_on_advice_and_a_cached_one_is_not(tmp_path):
    # No read-ahead workers below 8 MiB: the consumer's thread advises the kernel to fetch every
    # shard at once instead of faulting them in one after another. Cached, nothing is advised.
    # Shards of 512 KiB: reading a header brings a file's first pages in, a small file whole.
    from instanttensor._demo_bench import evict, resident_fraction, warm_up

    torch.manual_seed(36)
    shards = {f"s{i:02d}": torch.randn(128, 1024) for i in range(12)}
    files = [str(tmp_path / f"m{i:02d}.safetensors") for i in range(12)]
    for path, (name, tensor) in zip(files, shards.items()):
        reference_save({name: tensor}, path)
    if evict(files) > 0.5:
        pytest.skip("the page cache of the test's folder cannot be dropped (tmpfs)")
    with instanttensor.safe_open(files) as f:
        resident = sum(resident_fraction(path) for path in files) / len(files)
        if resident >= 0.5:  # judged at open, after the headers were read: what the pass sees
            pytest.skip(f"reading the headers brought {resident:.0%} of the shards in (the file "
                        "system reads ahead more than half a shard)")
        for name, tensor in f.tensors():
            assert same_bytes(tensor, shards[name]), name
        assert "MADV_WILLNEED on the consumer's thread" in f.stats()["backend"], f.stats()
    warm_up(files)
    with instanttensor.safe_open(files) as f:
        assert all(same_bytes(t, shards[n]) for n, t in f.tensors())
        assert "no read-ahead" in f.stats()["backend"], f.stats()


def test_misaligned_tensors_are_handed_out_aligned(tmp_path):
    # A header whose length is not a multiple of 8 puts every tensor off its dtype's alignment.
    import json
    import struct

    values = torch.arange(64, dtype=torch.float64)
    header = {"x": {"dtype": "F64", "shape": [64], "data_offsets": [0, 512]},
              "y": {"dtype": "I32", "shape": [4], "data_offsets": [512, 528]}}
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8 + 3)  # 3 bytes off
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + values.numpy().tobytes()
                     + torch.arange(4, dtype=torch.int32).numpy().tobytes())
    with instanttensor.safe_open(str(path)) as f:
        got = dict(f.tensors())
        assert f.stats()["misaligned_copies"] == 2
    assert got["x"].data_ptr() % 8 == 0 and torch.equal(got["x"], values)
    assert torch.equal(got["y"], torch.arange(4, dtype=torch.int32))


@pytest.mark.parametrize("copy", COPIES)
def test_a_fork_keeps_the_views_held_right_in_both_processes(checkpoint, copy, kept_as):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
        iteration = f.tensors()
        name, kept = next(iteration)

        def child():
            again = dict(f.tensors())  # a new pass in the child makes the held view owned first
            assert all(same_bytes(again[n], tensors[n]) for n in tensors)
            assert same_bytes(kept, tensors[name])
            return "ok"

        status, said = in_child(child)
        assert status == 0 and said == "ok", said
        rest = dict(iteration)
    assert same_bytes(kept, tensors[name])
    assert all(same_bytes(rest[n], tensors[n]) for n in rest)


@pytest.mark.parametrize("copy", COPIES)
def test_a_later_pass_never_shares_bytes_with_a_view_kept_from_an_earlier_one(checkpoint, copy,
                                                                             kept_as):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
        kept = dict(f.tensors())
        for name, tensor in f.tensors():  # a second pass over the same mapping
            assert same_bytes(tensor, tensors[name]), name
            tensor.add_(1)
            kept[name].mul_(0)
            assert torch.equal(tensor, tensors[name] + 1), name
        assert all(torch.count_nonzero(t) == 0 for t in kept.values())
        del kept
        again = dict(f.tensors())  # neither pass's in-place writes reach a third one
        assert all(same_bytes(again[n], tensors[n]) for n in tensors)


def test_an_explicit_read_backend_keeps_the_read_path(checkpoint):
    path, tensors = checkpoint
    with instanttensor.safe_open(path, backend="pread") as f:
        assert f.stats()["backend"] == "pread"
        got = dict(f.tensors())
    assert all(same_bytes(got[n], tensors[n]) for n in tensors)


@pytest.mark.parametrize("copy", COPIES)
def test_advice_the_kernel_refuses_is_counted_and_loses_nothing(tmp_path, monkeypatch, copy):
    # A checkpoint larger than memory is read once (MADV_SEQUENTIAL, MADV_HUGEPAGE) and unmapped
    # behind the consumer (MADV_DONTNEED); a kernel may refuse any of it (no THP, locked pages).
    # Every result is checked: refused, the load goes on with every byte right, a kept view
    # stays right, and stats() counts the refusals (none when the kernel takes the advice).
    torch.ops.load_library(fault_library())
    faults = torch.ops.instanttensor_testing
    tensors = {f"w{i:02d}": torch.full((1 << 20,), float(i)) for i in range(4)}  # 16 MiB
    path = str(tmp_path / "big.safetensors")
    reference_save(tensors, path)
    monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(12 << 20))
    for refused in (False, True):
        if refused:
            faults.arm_advice_refusal(-1, 22)  # every advice: EINVAL
        try:
            kept = None
            with instanttensor.safe_open(path, copy=copy) as f:
                for name, tensor in f.tensors():
                    assert same_bytes(tensor, tensors[name]), name
                    kept = tensor if kept is None else kept
                stats = f.stats()
        finally:
            faults.disarm_faults()
        assert "read once: MADV_SEQUENTIAL" in stats["backend"], stats["backend"]
        assert same_bytes(kept, tensors["w00"])
        if refused:
            assert stats["advice_refused"] >= 2, stats  # SEQUENTIAL and HUGEPAGE at least
        else:
            assert stats["advice_refused"] == 0, stats
        # Closed, its count stays what it was at close: another loader's refusals are not its.
        at_close = f.stats()["advice_refused"]
        faults.arm_advice_refusal(-1, 22)
        try:
            with instanttensor.safe_open(path, copy=copy) as other:
                for _ in other.tensors():
                    pass
            assert other.stats()["advice_refused"] >= 2
        finally:
            faults.disarm_faults()
        assert f.stats()["advice_refused"] == at_close
