"""A handle used after fork: random access in the child works with the child's own workers,
whatever the parent was doing at the fork; what cannot carry over (an iteration in flight, a
borrowed ring) raises at once; the parent is unaffected."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes

BACKENDS = ["pread", "direct", "mmap"]


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(21)
    tensors = {f"t{i:02d}": torch.randn(512, 1024) for i in range(24)}  # 48 MiB: reads in flight
    path = str(tmp_path / "model.safetensors")
    reference_save(tensors, path)
    return path, tensors


def in_child(body, timeout=20) -> tuple[int, str]:
    """Runs body() in a forked child; returns (exit status, what it wrote). A child that hangs
    is killed by its alarm (status SIGALRM), so a hang fails the test instead of the suite."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        os.close(read_end)
        signal.alarm(timeout)
        # As DataLoader's workers do: torch's OpenMP pool, used by the parent (earlier tests),
        # cannot run in a forked child (it waits for threads that do not exist there).
        torch.set_num_threads(1)
        code = 0
        try:
            message = body()
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            message, code = f"{type(error).__name__}: {error}", 1
        os.write(write_end, str(message).encode())
        os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return status, b"".join(chunks).decode()


class HandleDataset(torch.utils.data.Dataset):
    """The common Dataset pattern: one handle opened in the parent, read in the workers."""

    def __init__(self, handle, names, sliced):
        self.handle, self.names, self.sliced = handle, names, sliced

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        name = self.names[index]
        if self.sliced:
            return name, self.handle.get_slice(name)[100:300]
        return name, self.handle.get_tensor(name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sliced", [False, True], ids=["get_tensor", "get_slice"])
def test_dataloader_workers_forked_while_the_parent_iterates(checkpoint, backend, sliced):
    path, tensors = checkpoint
    names = sorted(tensors)
    with instanttensor.safe_open(path, backend=backend, concurrency=2,
                                 buffer_size=8 << 20) as f:
        iteration = f.tensors()
        first = next(iteration)  # reads of the next tensors are in flight on the workers
        loader = torch.utils.data.DataLoader(HandleDataset(f, names, sliced), batch_size=None,
                                             num_workers=2, multiprocessing_context="fork",
                                             timeout=60)
        items = list(loader)  # the workers fork here, with the parent's reads in flight
        rest = [first] + list(iteration)
    assert [n for n, _ in items] == names
    for name, tensor in items:
        expected = tensors[name][100:300] if sliced else tensors[name]
        assert same_bytes(tensor, expected), name
    assert [n for n, _ in rest] == names
    assert all(same_bytes(t, tensors[n]) for n, t in rest)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_in_the_middle_of_an_iteration(checkpoint, backend):
    path, tensors = checkpoint
    # The parent ran torch's parallel CPU kernels (OpenMP) before the fork, as a real program has:
    # the child's copies must not wait for the parent's OpenMP team.
    torch.randn(1024, 2048).clone()
    with instanttensor.safe_open(path, backend=backend, concurrency=2,
                                 buffer_size=8 << 20) as f:
        iteration = f.tensors()
        kept = dict([next(iteration), next(iteration)])

        def child():
            start = time.monotonic()
            with pytest.raises(ValueError, match="forked child.*open the checkpoint again"):
                next(iteration)
            took = time.monotonic() - start
            assert took < 1.0, took
            assert same_bytes(f.get_tensor("t17"), tensors["t17"])
            assert same_bytes(f.get_slice("t03")[7], tensors["t03"][7])
            # A new pass of this copy=True handle runs on the child's own workers.
            again = dict(f.tensors())
            assert all(same_bytes(again[n], tensors[n]) for n in tensors)
            destination = {"t09": torch.empty(512, 1024)}
            f.load_into(destination, strict=False)
            assert same_bytes(destination["t09"], tensors["t09"])
            f.close()  # never waits for the parent's workers
            return "ok"

        status, said = in_child(child)
        assert status == 0 and said == "ok", said
        kept.update(iteration)
    assert all(same_bytes(kept[n], tensors[n]) for n in tensors)


def test_a_fork_while_another_thread_is_inside_the_loader(checkpoint):
    # A background thread iterates (and so holds the loader's lock at moments) while the main
    # thread forks: the child's random access must not wait for a lock no thread will release.
    path, tensors = checkpoint
    with instanttensor.safe_open(path, backend="direct", concurrency=2,
                                 buffer_size=8 << 20) as f:
        done = []
        worker = threading.Thread(target=lambda: done.extend(f.tensors()))
        worker.start()
        statuses = []
        for _ in range(5):
            statuses.append(in_child(lambda: same_bytes(f.get_tensor("t11"), tensors["t11"])))
        worker.join()
    for status, said in statuses:
        assert status == 0 and said == "True", said
    assert all(same_bytes(t, tensors[n]) for n, t in done) and len(done) == len(tensors)


def test_borrowed_buffers_refuse_iteration_in_the_child_but_random_access_works(checkpoint):
    path, tensors = checkpoint
    # A named read backend: the borrow ring (on auto a host handle iterates views of the page
    # cache, which a child may iterate anew: tests/python/test_page_cache_views.py).
    with instanttensor.safe_open(path, copy=False, buffer_size=16 << 20, backend="pread") as f:
        iteration = f.tensors()
        name, view = next(iteration)

        def child():
            for attempt in (lambda: next(iteration), lambda: next(iter(f.tensors()))):
                with pytest.raises(ValueError, match="forked child"):
                    attempt()
            assert same_bytes(f.get_tensor("t20"), tensors["t20"])
            return "ok"

        status, said = in_child(child)
        assert status == 0 and said == "ok", said
        assert same_bytes(view, tensors[name])
        assert all(same_bytes(t, tensors[n]) for n, t in iteration)


def test_the_vllm_iterator_and_the_loader_class_behave_the_same(checkpoint):
    from instanttensor.integrations.vllm import instanttensor_weights_iterator

    path, tensors = checkpoint
    weights = instanttensor_weights_iterator([path], False)
    next(weights)
    loader = torch.classes.instanttensor.Loader([path])
    loader.next()

    def child():
        with pytest.raises(ValueError, match="forked child"):
            next(weights)
        with pytest.raises(RuntimeError, match="forked child"):
            loader.next()
        assert same_bytes(loader.get_tensor("t04"), tensors["t04"])
        loader.close()
        return "ok"

    status, said = in_child(child)
    assert status == 0 and said == "ok", said
    assert len(list(weights)) == len(tensors) - 1
    loader.close()
