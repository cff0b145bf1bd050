"""A copy=True (or borrowed) host tensor the consumer keeps past its step is the consumer's: it
behaves as an owned tensor does whatever the consumer does with it (share_memory_, Queues of
torch.multiprocessing, pickling, exports, set_, resize_, fork), and keeping views costs the rest
of the process nothing it would not pay with safetensors (no copy at fork, bounded descriptors,
one kernel map area per file, never a SIGBUS). loader/pass/kept_views.h decides for them.
Each body that could crash the process runs in a forked child (in_child): a segfault or SIGBUS
fails the test instead of the suite."""

from __future__ import annotations

import mmap
import os
import pickle
import resource
import signal
import threading

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes
from test_fork import in_child
from test_page_cache_views import (COPIES, _data_start, _expect_kept, _rewrite_in_place,  # noqa: F401
                                   checkpoint, kept_as)


def _ok(status_and_said) -> None:
    status, said = status_and_said
    assert status == 0 and said == "ok", (status, said)


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("when", ["during its step", "after the pass"])
def test_share_memory_of_a_kept_tensor(checkpoint, copy, kept_as, when):
    # What torch.multiprocessing's Queue does to every tensor it sends: the storage is repointed
    # to shared memory. Done during the step, it is torch's storage then, never touched by us.
    path, tensors = checkpoint

    def body():
        with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
            iteration = f.tensors()
            name, first = next(iteration)
            if when == "during its step":
                first.share_memory_()
                pointer = first.data_ptr()
            rest = {n: t.clone() for n, t in iteration}
        if when == "after the pass":
            first.share_memory_()
            pointer = first.data_ptr()
        _rewrite_in_place(path)
        assert first.is_shared() and first.data_ptr() == pointer
        assert same_bytes(first, tensors[name])
        assert all(same_bytes(rest[n], tensors[n]) for n in rest)
        first.add_(1)  # still writable, still shared
        assert torch.equal(first, tensors[name] + 1)
        return "ok"

    _ok(in_child(body))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_kept_tensor_sent_through_a_multiprocessing_queue(checkpoint, kept_as, context):
    # The child sees the bytes; the parent sees the child's writes (shared memory both ways).
    import torch.multiprocessing as mp

    path, tensors = checkpoint

    def body():
        ctx = mp.get_context(context)
        to_child, to_parent = ctx.SimpleQueue(), ctx.SimpleQueue()  # pickled in put(): no thread
        child = ctx.Process(target=_add_one_and_report, args=(to_child, to_parent))
        child.start()
        try:
            with instanttensor.safe_open(path, concurrency=2) as f:
                iteration = f.tensors()
                name, first = next(iteration)
                to_child.put(first)  # shared now, during its step
                rest = dict(iteration)  # the pass moves on while the child holds it
            child_sum = to_parent.get()
            to_child.put("go")  # the child writes now
            assert to_parent.get() == "written"
            child.join(60)
            assert child.exitcode == 0, child.exitcode
        finally:
            if child.is_alive():  # a failure above: never leave it waiting on the queue
                child.kill()
        assert child_sum == float(tensors[name].double().sum())
        assert torch.equal(first, tensors[name] + 1)
        assert all(same_bytes(rest[n], tensors[n]) for n in rest)
        return "ok"

    _ok(in_child(body, timeout=120))


def _add_one_and_report(to_child, to_parent):
    tensor = to_child.get()
    to_parent.put(float(tensor.double().sum()))
    assert to_child.get() == "go"
    tensor.add_(1)
    to_parent.put("written")


@pytest.mark.parametrize("copy", COPIES)
def test_pickling_exports_set_and_resize_of_kept_tensors(checkpoint, copy, kept_as):
    path, tensors = checkpoint

    def body():
        with instanttensor.safe_open(path, copy=copy, concurrency=2) as f:
            iteration = f.tensors()
            n0, pickled = next(iteration)
            restored = pickle.loads(pickle.dumps(pickled))  # during its step
            n1, exported = next(iteration)
            array = exported.numpy()  # the array keeps the tensor counted: it is kept
            n2, replaced = next(iteration)
            replaced.set_(torch.zeros(3).untyped_storage())  # the view's storage dropped
            n3, grown = next(iteration)
            grown.resize_(grown.numel() * 2)  # torch's allocator gives it new memory
            n4, dlpacked = next(iteration)
            from_dlpack = torch.from_dlpack(dlpacked)
            rest = dict(iteration)
        _rewrite_in_place(path)
        assert same_bytes(restored, tensors[n0]) and same_bytes(pickled, tensors[n0])
        assert same_bytes(exported, tensors[n1]) and same_bytes(dlpacked, tensors[n4])
        # An export taken during the step keeps its own pointer into the mapping: under a lease
        # those pages are private copies once a writer comes; where leases are refused, a view
        # of 1 MiB or more is copied where it is when the pass moves on. One copied out (a
        # smaller view, or past the cap) leaves the export viewing the file (README, copy=True).
        exports_protected = kept_as != "copied out"
        assert same_bytes(torch.from_numpy(array), tensors[n1]) == exports_protected
        assert same_bytes(from_dlpack, tensors[n4]) == exports_protected
        assert torch.equal(replaced, torch.zeros(3))
        assert same_bytes(grown[: tensors[n3].numel()], tensors[n3].flatten())
        assert all(same_bytes(rest[n], tensors[n]) for n in rest)
        return "ok"

    _ok(in_child(body))


def test_where_the_lease_is_refused_a_large_view_is_copied_where_it_is(checkpoint, monkeypatch):
    # Its pages are replaced by private copies at the same addresses when the pass moves on:
    # the storage is not repointed, so a numpy array taken during the step reads owned bytes,
    # through a truncation of the file too. Past the process's cap on such copies (each is a
    # kernel map area) a view is copied out and repointed instead, as a small one always is.
    monkeypatch.setenv("INSTANTTENSOR_TESTING_NO_LEASE", "1")
    path, tensors = checkpoint
    names = sorted(tensors)
    for cap, copied_in_place in ((None, len(names) - 1), ("3", 3)):
        if cap:
            monkeypatch.setenv("INSTANTTENSOR_TESTING_VIEWS_COPIED_AT_ONCE_MAX", cap)
        reference_save(tensors, path)

        def body():
            pointers, arrays = {}, {}
            with instanttensor.safe_open(path, concurrency=2) as f:
                kept = {}
                for name, tensor in f.tensors():
                    kept[name] = tensor
                    pointers[name] = tensor.data_ptr()
                    arrays[name] = tensor.numpy()  # during its step
                stats = f.stats()
            # The last one was read into owned memory beside the pass: never a view.
            in_place = [n for n in names[:-1] if kept[n].data_ptr() == pointers[n]]
            if len(in_place) != copied_in_place or stats["materializations"] != len(names) - 1:
                return f"{len(in_place)} copied in place, {stats['materializations']} in all"
            # Neighbours copied where they are make one kernel map area (vm.max_map_count).
            first, last = kept[in_place[0]], kept[in_place[-1]]
            span = (first.data_ptr(), last.data_ptr() + last.nbytes)
            if len(_map_areas_meeting(*span)) != 1:
                return f"the copies span {_map_areas_meeting(*span)}"
            os.truncate(path, 0)
            for name in names:
                if not same_bytes(kept[name], tensors[name]):
                    return f"{name} changed"
                if name in in_place and not same_bytes(torch.from_numpy(arrays[name]),
                                                        tensors[name]):
                    return f"the export of {name} changed"
            return "ok"

        _ok(in_child(body))


def _map_areas_meeting(begin: int, end: int) -> list:
    with open("/proc/self/maps") as maps:
        ranges = [[int(x, 16) for x in line.split()[0].split("-")] for line in maps]
    return [(a, b) for a, b in ranges if a < end and b > begin]


def _anonymous_kb() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    raise AssertionError("no Anonymous line in /proc/self/smaps_rollup")


def test_a_fork_copies_no_kept_byte_in_the_parent(tmp_path, kept_as):
    # 64 MiB kept under leases: a fork used to copy every kept byte in the parent (its
    # pthread_atfork handler), 1 GB taking seconds and 1 GB of memory. Now it costs what a fork
    # costs beside safetensors' tensors; the child reads every byte right.
    torch.manual_seed(5)
    tensors = {f"w{i}": torch.randn(1 << 20) for i in range(16)}  # 4 MiB each
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    with instanttensor.safe_open(path, concurrency=2) as f:
        kept = dict(f.tensors())
        _expect_kept(f.stats(), kept_as, leased=16, copied=15)
    before = _anonymous_kb()
    _ok(in_child(lambda: "ok" if all(same_bytes(kept[n], tensors[n]) for n in tensors) else "bad"))
    grown_kb = _anonymous_kb() - before
    assert grown_kb < 8 << 10, f"the fork copied {grown_kb} KiB in the parent"
    assert all(same_bytes(kept[n], tensors[n]) for n in tensors)


def test_a_rewrite_after_a_fork_reaches_a_child_s_leased_views_as_safetensors_tensors(checkpoint,
                                                                                    kept_as):
    # The README's sentence: after a fork, the parent's kept tensors stay protected; a child's
    # share the parent's pages, and where they were kept under a lease (no lease covers the
    # child), a rewrite of the file in place shows in them, as in safetensors' tensors (views of
    # a private mapping); copied ones never change.
    path, tensors = checkpoint
    with instanttensor.safe_open(path, concurrency=2) as f:
        kept = dict(f.tensors())
    read_end, write_end = os.pipe()
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(60)  # a hang fails the test instead of the suite
            torch.set_num_threads(1)  # the parent's OpenMP pool cannot run here (test_fork.py)
            os.close(write_end)
            os.read(read_end, 1)  # the parent rewrote the file
            rewritten = torch.full((256 * 1024 * 4,), 0x7F, dtype=torch.uint8)
            changed = [n for n in tensors
                       if same_bytes(kept[n].view(-1).view(torch.uint8), rewritten)]
            same = [n for n in tensors if same_bytes(kept[n], tensors[n])]
            os.write(report_write, f"{len(changed)} {len(same)}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(read_end)
    _rewrite_in_place(path)
    os.write(write_end, b"x")
    _, status = os.waitpid(pid, 0)
    said = os.read(report_read, 100).decode()
    assert status == 0, status
    assert all(same_bytes(kept[n], tensors[n]) for n in tensors)  # the parent's: protected
    # Copied: the last one was read into owned memory, the others copied at their steps.
    expected = "12 0" if kept_as == "leased" else "0 12"
    assert said == expected, said


@pytest.mark.parametrize("load", ["load_file", "safe_open"])
def test_keeping_tensors_of_1500_files_under_a_1024_descriptor_limit(tmp_path, monkeypatch, load):
    # One lease (a descriptor) per file kept left the process one free descriptor; leases are
    # capped (io::FileLease::max_leases), past the cap views are copied. 33 tensors a file:
    # load_file goes through a pass and keeps its views too (a file of 32 or fewer small tensors
    # is read tensor by tensor: host_policy.h, choose_load_file_path).
    monkeypatch.setenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES", "0")
    files = []
    for i in range(1500):
        path = str(tmp_path / f"s{i:04d}.safetensors")
        shard = {f"t{i:04d}": torch.full((64,), float(i))}
        shard.update({f"t{i:04d}.{j:02d}": torch.full((16,), float(j)) for j in range(32)})
        reference_save(shard, path)
        files.append(path)

    def body():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        kept = {}
        for path in files:
            if load == "load_file":
                kept.update(instanttensor.load_file(path))
            else:
                with instanttensor.safe_open(path) as f:
                    kept.update(f.tensors())
        held = len(os.listdir("/proc/self/fd"))
        opened = [os.open(files[i], os.O_RDONLY) for i in range(900)]  # EMFILE before
        for fd in opened:
            os.close(fd)
        assert held < 1024 - 900, held
        assert all(kept[f"t{i:04d}"][0].item() == float(i) for i in range(1500))
        return "ok"

    _ok(in_child(body, timeout=120))


def test_a_truncating_writer_racing_copies_never_raises_sigbus(tmp_path, monkeypatch):
    # Leases refused: kept views are copied when the pass moves on, through the kernel's copy. A
    # writer truncating and restoring the file meanwhile makes the copies short: an error naming
    # the file, or zeros past the end, never a SIGBUS (the copy read through the mapping before).
    monkeypatch.setenv("INSTANTTENSOR_TESTING_NO_LEASE", "1")
    torch.manual_seed(9)
    tensors = {f"t{i:02d}": torch.randn(256, 1024) for i in range(16)}
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    size = os.path.getsize(path)
    start = _data_start(path)

    def body():
        stop = threading.Event()
        rounds = [0]

        def writer():
            while not stop.is_set():
                os.truncate(path, start + (size - start) // 3)
                os.truncate(path, size)
                rounds[0] += 1

        thread = threading.Thread(target=writer)
        outcomes = {"ok": 0, "error": 0}
        thread.start()
        try:
            while sum(outcomes.values()) < 30 or rounds[0] < 10:
                try:
                    with instanttensor.safe_open(path, concurrency=2) as f:
                        kept = list(f.tensors())
                    outcomes["ok"] += 1
                    del kept
                except Exception as error:  # noqa: BLE001 - each names the file
                    assert path in str(error), error
                    outcomes["error"] += 1
        finally:
            stop.set()
            thread.join()
        return "ok" if outcomes["error"] else f"no load met the writer: {outcomes}"

    _ok(in_child(body, timeout=120))


def test_20000_kept_views_of_one_file_leave_one_map_area(tmp_path, monkeypatch, kept_as):
    # A kernel map area per kept view (advice per view, remaps) would reach vm.max_map_count
    # (65530) long before memory does; the mapping stays whole.
    monkeypatch.setenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES", "0")
    for memory, read_once in ((48 << 20, True), (None, False)):
        if memory:
            monkeypatch.setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", str(memory))
        else:
            monkeypatch.delenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", raising=False)
        tensors = {f"t{i:05d}": torch.full((1031,), float(i)) for i in range(20000)}  # 82 MB
        path = str(tmp_path / f"many-{read_once}.safetensors")
        reference_save(tensors, path)
        with instanttensor.safe_open(path) as f:
            kept = dict(f.tensors())
            stats = f.stats()
            assert ("read once" in stats["backend"]) == read_once, stats["backend"]
        target = os.path.realpath(path)
        with open("/proc/self/maps") as maps:
            areas = [line for line in maps if line.rstrip().endswith(target)]
        assert len(areas) <= 2, len(areas)
        assert all(kept[f"t{i:05d}"][3].item() == float(i) for i in range(0, 20000, 997))
        assert stats["leased_views"] == (20000 if kept_as == "leased" else 0)


@pytest.mark.parametrize("kept_as", ["copied", "copied out"], indirect=True)
def test_a_kept_view_with_no_memory_for_its_copy_is_an_out_of_memory_error(tmp_path, kept_as):
    # Leases refused, the address space capped after the second step: the copy of the view kept
    # past its step cannot be made. The step raises torch's OutOfMemoryError naming the file and
    # the tensor; the view stays a view of the file (its bytes and the consumer's write right),
    # set apart: the unmapping behind the consumer goes on past it (the next view, dropped, is
    # unmapped), and the close, with memory again, makes it owned.
    torch.manual_seed(3)
    tensors = {f"t{i}": torch.randn(8 << 20) for i in range(5)}  # 32 MiB each
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)

    def body():
        with instanttensor.safe_open(path, concurrency=2) as f:
            iteration = f.tensors()
            name, kept = next(iteration)
            kept.add_(1)  # the consumer's in-place write: private pages of the mapping
            _, dropped = next(iteration)
            assert same_bytes(dropped, tensors["t1"])  # its pages mapped now
            dropped_pages = (dropped.data_ptr(), dropped.nbytes)
            del dropped
            with open("/proc/self/status") as status:
                vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
            headroom = 16 << 20  # less than the 32 MiB copy
            resource.setrlimit(resource.RLIMIT_AS, (vm_kb * 1024 + headroom, resource.RLIM_INFINITY))
            try:
                try:
                    next(iteration)
                except torch.OutOfMemoryError as error:
                    message = str(error)
                else:
                    return "no error"
                # The engine's pass goes on past the error (the Python generator ended with it;
                # the step that failed moved past t2): at each step the view that found no
                # memory is tried again, unsaid, and once the dropped one is no longer the last
                # handed out, it is let go and unmapped behind the consumer.
                following = [f._engine().next()[0] for _ in range(2)]
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
            assert path in message and name in message and "no memory" in message, message
            assert same_bytes(kept, tensors[name] + 1)
            assert following == ["t3", "t4"], following
            if _present_pages(*dropped_pages) > 1:  # but the page it shares with `kept`
                return "the unmapping stopped at the view that found no memory"
        assert same_bytes(kept, tensors[name] + 1)
        return "ok"

    _ok(in_child(body, timeout=60))


def _present_pages(address: int, length: int) -> int:
    """How many pages of [address, address + length) this process has mapped in its page table
    (/proc/self/pagemap's present bit)."""
    page = mmap.PAGESIZE
    first, last = address // page, (address + length - 1) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read((last - first + 1) * 8)
    return sum(int.from_bytes(entries[i:i + 8], "little") >> 63 for i in range(0, len(entries), 8))

