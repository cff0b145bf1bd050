"""The public Python API: arguments, environment variables, metadata, selection, stats."""

from __future__ import annotations

import os
import time

import pytest
import torch
from safetensors import safe_open as reference_open

import instanttensor
from conftest import same_bytes

# Read at import: the suite's autouse fixture clears INSTANTTENSOR_* variables for each test.
CMAKE_BUILD_DIR = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")


def test_upstream_call_shape_and_attributes(model_files):
    paths, tensors = model_files
    f = instanttensor.safe_open(paths, "pt", "cpu", None, copy=True, buffer_size=1 << 20,
                                chunk_size=4096, concurrency=2, io_depth=8,
                                max_free_mem_usage=0.5, backend="BUFFERED", load_now=True)
    assert f.total_tensor_size == sum(t.nbytes for t in tensors.values())
    assert f.buffer_size == 1 << 20
    assert f.offset_keys()[0] == "layers.0.attn.weight"  # file 1; F32 ahead of BF16, then name
    assert f.keys() == sorted(tensors)
    names = [n for n, _ in f.tensors()]
    assert names == f.offset_keys()
    f.close()


def test_metadata_none_when_absent(tmp_path):
    from safetensors.torch import save_file

    path = str(tmp_path / "plain.safetensors")
    save_file({"x": torch.ones(2)}, path)
    with instanttensor.safe_open(path) as f, reference_open(path, framework="pt") as ref:
        assert f.metadata() is None
        assert ref.metadata() is None
        assert f.get_tensor_metadata("x") == (torch.float32, torch.Size([2]))


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "CPU".lower()])
def test_device_forms(model_files, device):
    paths, tensors = model_files
    with instanttensor.safe_open(paths, device=device) as f:
        assert f.get_tensor("embed.weight").device.type == "cpu"


def test_bad_arguments_are_value_errors(model_files):
    paths, tensors = model_files
    with pytest.raises(ValueError, match="framework='tf' is not supported"):
        instanttensor.safe_open(paths, framework="tf")
    with pytest.raises(ValueError, match="framework 'arrow' is invalid"):
        instanttensor.safe_open(paths, framework="arrow")
    with pytest.raises(ValueError, match="device='warp:0' is not a device"):
        instanttensor.safe_open(paths, device="warp:0")
    with pytest.raises(ValueError, match="chunk_size"):
        instanttensor.safe_open(paths, chunk_size=0)
    with pytest.raises(ValueError, match="max_free_mem_usage"):
        instanttensor.safe_open(paths, max_free_mem_usage=1.5)
    with pytest.raises(ValueError, match="backend"):
        instanttensor.safe_open(paths, backend="teleport")
    with pytest.raises(ValueError, match="keys"):
        instanttensor.safe_open(paths, keys="embed.weight")
    with pytest.raises(ValueError, match="at least one file"):
        instanttensor.safe_open([])
    if not torch.cuda.is_available():
        # Lazy, as the reference: the names answer; the first tensor asked raises.
        with instanttensor.safe_open(paths, device="cuda") as f:
            assert f.keys() == sorted(tensors)
            assert f.get_slice("embed.weight").get_shape() == [64, 32]
            for call in (lambda: f.get_tensor("embed.weight"), lambda: next(f.tensors()),
                         f.get_tensors, lambda: f.get_slice("embed.weight")[0:2]):
                with pytest.raises(ValueError, match="CUDA is not available"):
                    call()


@pytest.mark.parametrize("variable,value", [
    ("INSTANTTENSOR_BUFFER_SIZE", "lots"),
    ("INSTANTTENSOR_CHUNK_SIZE", "-4"),
    ("INSTANTTENSOR_CONCURRENCY", "0"),
    ("INSTANTTENSOR_IO_DEPTH", "1.5"),
    ("INSTANTTENSOR_BACKEND", "nvme-of"),
    ("INSTANTTENSOR_DEBUG", "true"),
    ("INSTANTTENSOR_TIMELINE", "yes"),
    ("INSTANTTENSOR_MAX_FREE_MEM_USAGE", "2"),
])
def test_bad_environment_values_name_the_variable(model_files, monkeypatch, variable, value):
    paths, _ = model_files
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable) as info:
        instanttensor.safe_open(paths)
    assert "accepted" in str(info.value)


def test_environment_sets_defaults_and_arguments_win(model_files, monkeypatch):
    paths, _ = model_files
    monkeypatch.setenv("INSTANTTENSOR_BUFFER_SIZE", "2M")
    with instanttensor.safe_open(paths) as f:
        assert f.buffer_size == 2 << 20
    with instanttensor.safe_open(paths, buffer_size=4096) as f:
        assert f.buffer_size == 4096


def test_key_selection_reads_only_selected_bytes(model_files):
    paths, tensors = model_files
    wanted = ["layers.6.mlp.weight", "embed.weight"]
    with instanttensor.safe_open(paths, keys=wanted) as f:
        assert f.keys() == sorted(wanted)
        loaded = dict(f.tensors())
        assert set(loaded) == set(wanted)
        assert f.total_tensor_size == sum(tensors[k].nbytes for k in wanted)
        assert f.stats()["bytes_read"] == f.total_tensor_size
        with pytest.raises(KeyError, match="layers.0.attn.weight"):
            f.get_tensor("layers.0.attn.weight")
    with pytest.raises(KeyError, match="nope"):
        instanttensor.safe_open(paths, keys=["nope"])


def test_unknown_name_is_key_error_naming_file_and_tensor(model_files):
    paths, _ = model_files
    with instanttensor.safe_open(paths) as f:
        with pytest.raises(KeyError) as info:
            f.get_tensor("missing.weight")
        assert "missing.weight" in str(info.value)
        assert "model-00001-of-00002.safetensors" in str(info.value)


def test_usable_without_with_and_after_close(model_files):
    paths, tensors = model_files
    f = instanttensor.safe_open(paths[0])
    assert same_bytes(f.get_tensor("embed.weight"), tensors["embed.weight"])
    f.close()
    f.close()
    for call in (f.keys, lambda: f.get_tensor("embed.weight")):  # as the reference
        with pytest.raises(instanttensor.SafetensorError, match="File is closed"):
            call()


def test_stats_report_bytes_and_backend(model_files):
    paths, tensors = model_files
    with instanttensor.safe_open(paths, backend="pread") as f:  # the read path's figures
        for _ in f.tensors():
            pass
        stats = f.stats()
    assert stats["bytes_read"] == sum(t.nbytes for t in tensors.values())
    assert stats["tensors_loaded"] == len(tensors)
    assert stats["backend"] == "pread"
    assert isinstance(stats["read_seconds"], float) and stats["read_seconds"] > 0


def test_save_file_refuses_what_safetensors_refuses(tmp_path):
    base = torch.randn(4, 4)
    with pytest.raises(ValueError, match="contiguous"):
        instanttensor.save_file({"t": base.t()}, str(tmp_path / "a.safetensors"))
    with pytest.raises(RuntimeError, match="share memory"):
        instanttensor.save_file({"a": base, "b": base[1]}, str(tmp_path / "b.safetensors"))
    with pytest.raises(TypeError, match="metadata"):
        instanttensor.save_file({"a": base}, str(tmp_path / "c.safetensors"), metadata={"n": 1})
    instanttensor.save_file({"a": base[0], "b": base[1]}, str(tmp_path / "d.safetensors"))
    loaded = instanttensor.load_file(tmp_path / "d.safetensors")
    assert same_bytes(loaded["b"], base[1].clone())


def test_version_and_build_info():
    assert instanttensor.__version__
    info = torch.ops.instanttensor.build_info()
    assert torch.__version__.split("+")[0] in info


def test_another_patch_release_of_the_same_minor_version_loads(monkeypatch):
    # The wheel requires torch==2.13.*: pip may pair it with any patch release of that minor.
    from instanttensor import _library
    from instanttensor._build_info import TORCH_VERSION

    loaded = []
    monkeypatch.setattr(_library, "_loaded_path", None)
    minor = ".".join(TORCH_VERSION.split("+")[0].split(".")[:2])
    monkeypatch.setattr(_library.torch, "__version__", f"{minor}.99+cu130")
    monkeypatch.setattr(_library.torch.ops, "load_library", loaded.append)
    assert _library.load_library() == _library.library_path() == loaded[0]


def test_version_mismatch_is_an_import_error_naming_both(monkeypatch):
    from instanttensor import _library

    monkeypatch.setattr(_library, "_loaded_path", None)
    monkeypatch.setattr(_library.torch, "__version__", "1.0.0+cpu")
    with pytest.raises(ImportError) as info:
        _library.load_library()
    message = str(info.value)
    assert "1.0.0+cpu" in message and "rebuild" in message
    from instanttensor._build_info import TORCH_VERSION

    assert TORCH_VERSION in message


def test_every_method_after_close(model_files):
    paths, tensors = model_files
    f = instanttensor.safe_open(paths)
    f.close()
    f.close()  # idempotent
    # Every method raises, as the reference's "File is closed" (a SafetensorError that is also
    # the ValueError it was), naming the file; only stats() keeps the final counts.
    for call in (lambda: f.get_tensor("embed.weight"), lambda: next(f.tensors()),
                 lambda: f.get_slice("embed.weight"), f.get_tensors, f.keys, f.offset_keys,
                 f.metadata, lambda: f.get_tensor_metadata("embed.weight"),
                 lambda: f.load_into({"embed.weight": torch.empty(64, 32, dtype=torch.bfloat16)}),
                 lambda: f.total_tensor_size):
        with pytest.raises(instanttensor.SafetensorError, match="File is closed") as info:
            call()
        assert isinstance(info.value, ValueError)
        assert paths[0] in str(info.value)
    assert f.stats()["tensors_loaded"] == 0


def test_close_from_another_thread_during_iteration(model_files):
    import threading

    build = CMAKE_BUILD_DIR
    library = os.path.join(build or "", "libinstanttensor_testing.so")
    if not build or not os.path.exists(library):
        pytest.skip("needs the CMake build's test-only library (INSTANTTENSOR_CMAKE_BUILD_DIR)")
    torch.ops.load_library(library)
    paths, tensors = model_files
    # concurrency given: reads on the workers (a checkpoint this small would read inline).
    # backend named: the delay slows the read path (a host iteration of views reads nothing).
    f = instanttensor.safe_open(paths, chunk_size=4096, concurrency=2, backend="pread")
    got, outcome = {}, {}

    def iterate():
        try:
            for name, tensor in f.tensors():
                got[name] = tensor
        except ValueError as error:
            outcome["error"] = str(error)

    torch.ops.instanttensor_testing.arm_read_delay(60)  # a slow disk: the close lands mid-pass
    try:
        worker = threading.Thread(target=iterate)
        worker.start()
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:  # the first tensor is out: mid-pass
            time.sleep(0.005)
        f.close()  # waits for the step in progress, then releases everything
        worker.join(timeout=60)
    finally:
        torch.ops.instanttensor_testing.disarm_faults()
    assert not worker.is_alive()
    assert "the checkpoint was closed" in outcome.get("error", ""), (outcome, len(got))
    assert 0 < len(got) < len(tensors)
    for name, tensor in got.items():
        assert same_bytes(tensor, tensors[name]), name


def test_metadata_of_several_files_merges_with_the_first_file_winning(tmp_path):
    paths = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    instanttensor.save_file({"x": torch.ones(2)}, paths[0], metadata={"a": "1", "b": "first"})
    instanttensor.save_file({"y": torch.ones(2)}, paths[1], metadata={"b": "second", "c": "3"})
    with instanttensor.safe_open(paths) as f:
        assert f.metadata() == {"a": "1", "b": "first", "c": "3"}
    with instanttensor.safe_open(list(reversed(paths))) as f:  # files are sorted: same answer
        assert f.metadata() == {"a": "1", "b": "first", "c": "3"}
