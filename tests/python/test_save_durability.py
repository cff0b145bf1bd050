"""save_file as the trusted writers do it: the name only ever refers to a complete file, a killed
or failed save leaves nothing behind, and the data is synced before the rename."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".tmp-instanttensor-" in n)


@pytest.fixture
def old_checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    old = {"w": torch.arange(1000, dtype=torch.float32)}
    reference_save(old, str(path))
    return path, old


KILLED_SAVE = textwrap.dedent("""
    import sys, torch, instanttensor
    big = {"w": torch.ones(1 << 28, dtype=torch.float32)}  # 1 GiB
    print("saving", flush=True)
    instanttensor.save_file(big, sys.argv[1])
    print("saved", flush=True)
""")


def test_sigkill_during_a_1gb_save_keeps_the_old_file_and_leaves_nothing(old_checkpoint,
                                                                         tmp_path):
    path, old = old_checkpoint
    script = tmp_path / "save.py"
    script.write_text(KILLED_SAVE)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "saving"
    # Kill while the bytes are being written: the process has an open file in the folder.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fds = os.listdir(f"/proc/{proc.pid}/fd")
        targets = []
        for fd in fds:
            try:
                targets.append(os.readlink(f"/proc/{proc.pid}/fd/{fd}"))
            except OSError:
                pass
        if any(t.startswith(str(tmp_path)) and "save.py" not in t for t in targets):
            break
        time.sleep(0.005)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    loaded = reference_load(str(path))
    assert loaded.keys() == old.keys() and same_bytes(loaded["w"], old["w"])
    assert leftovers(tmp_path) == []


def test_a_temporary_left_by_a_dead_process_is_removed_by_the_next_save(old_checkpoint,
                                                                        tmp_path):
    path, _ = old_checkpoint
    # What a save killed between naming its file and the rename (or an older version) leaves.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in (f"{path.name}.tmp-instanttensor-{dead}-0", f"{path.name}.tmp-instanttensor-{dead}"):
        (tmp_path / name).write_bytes(b"partial")
    alive = tmp_path / f"{path.name}.tmp-instanttensor-{os.getpid()}-999"
    alive.write_bytes(b"another save of this live process")
    instanttensor.save_file({"x": torch.ones(3)}, str(path))
    assert leftovers(tmp_path) == [alive.name]  # a live process's temporary is left alone
    assert same_bytes(reference_load(str(path))["x"], torch.ones(3))


def test_a_full_disk_raises_oserror_naming_the_path_and_loses_nothing(old_checkpoint, tmp_path):
    path, old = old_checkpoint
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent("""
        import resource, signal, sys, torch, instanttensor
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            instanttensor.save_file({"w": torch.ones(1 << 20)}, sys.argv[1])  # 4 MiB
        except OSError as error:  # the built-in type, and the reference's SafetensorError
            assert isinstance(error, instanttensor.SafetensorError), type(error)
            print(next(t for t in type(error).__mro__ if t.__module__ == "builtins").__name__,
                  error)
        else:
            print("no error")
    """))
    result = subprocess.run([sys.executable, str(script), str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.startswith("OSError"), result.stdout + result.stderr
    assert str(path) in result.stdout and "File too large" in result.stdout
    loaded = reference_load(str(path))
    assert same_bytes(loaded["w"], old["w"])
    assert leftovers(tmp_path) == []


def test_a_read_only_folder_raises_permission_error_and_loses_nothing(old_checkpoint, tmp_path):
    path, old = old_checkpoint
    if os.geteuid() == 0:  # root ignores permission bits: an immutable folder refuses it too
        if subprocess.run(["chattr", "+i", str(tmp_path)], capture_output=True).returncode != 0:
            pytest.skip("root, and chattr +i is not supported on this file system")
        undo = ["chattr", "-i", str(tmp_path)]
    else:
        os.chmod(tmp_path, stat.S_IRUSR | stat.S_IXUSR)
        undo = None
    try:
        with pytest.raises(PermissionError, match=str(path)):
            instanttensor.save_file({"x": torch.ones(2)}, str(path))
    finally:
        if undo:
            subprocess.run(undo, check=True)
        os.chmod(tmp_path, stat.S_IRWXU)
    assert same_bytes(reference_load(str(path))["w"], old["w"])
    assert leftovers(tmp_path) == []


def test_two_threads_saving_one_path_both_succeed_and_one_whole_version_wins(tmp_path):
    # Which rename lands last is not observable from the callers (a thread can return after the
    # other one renamed later), so the check is the contract itself: both calls succeed, the file
    # is exactly one of the two versions, never a mix, and no temporary is left.
    path = str(tmp_path / "model.safetensors")
    first = {"w": torch.zeros(1 << 22)}  # 16 MiB: the two writes overlap in time
    second = {"w": torch.ones(1 << 22), "b": torch.ones(3)}
    errors = []

    def save(tensors):
        try:
            instanttensor.save_file(tensors, path)
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    for _ in range(3):
        threads = [threading.Thread(target=save, args=(t,)) for t in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        loaded = reference_load(path)
        winner = second if "b" in loaded else first
        assert loaded.keys() == winner.keys()
        assert all(same_bytes(loaded[n], winner[n]) for n in winner)
        assert leftovers(tmp_path) == []


def test_an_error_while_saving_removes_the_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError):
        instanttensor.save_file({"__metadata__": torch.ones(1)}, str(path))  # refused name
    assert not path.exists() and leftovers(tmp_path) == []


def test_the_saved_file_is_synced_before_the_rename(tmp_path):
    # strace shows the order of the calls: fsync of the data, rename (or link+rename), then the
    # folder's fsync.
    import shutil

    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    path = tmp_path / "model.safetensors"
    script = tmp_path / "sync.py"
    script.write_text("import sys, torch, instanttensor\n"
                      "instanttensor.save_file({'x': torch.ones(4)}, sys.argv[1])\n")
    trace = tmp_path / "trace.txt"
    subprocess.run(["strace", "-f", "-o", str(trace), "-e", "trace=fsync,rename,renameat,"
                    "renameat2,linkat,openat", sys.executable, str(script), str(path)],
                   check=True, timeout=120, capture_output=True)
    calls = [line for line in trace.read_text().splitlines()
             if ("fsync(" in line or "rename" in line or "linkat(" in line
                 or ("openat(" in line and str(tmp_path) in line and "O_TMPFILE" in line))]
    kinds = []
    for line in calls:
        for kind in ("O_TMPFILE", "fsync", "linkat", "rename"):
            if kind in line:
                kinds.append(kind)
                break
    assert kinds[-4:] == ["fsync", "linkat", "rename", "fsync"] or \
        kinds[-3:] == ["fsync", "rename", "fsync"], calls
    assert same_bytes(reference_load(str(path))["x"], torch.ones(4))
