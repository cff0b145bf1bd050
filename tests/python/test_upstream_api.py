"""Upstream InstantTensor 0.2.2's API on our engine: tensor_filter and its match modes, the
Backend / BackendPolicy enums and INSTANTTENSOR_BACKEND names, load_now, argument order, the
distribution's version. The callers' own released code is in test_callers.py."""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes
from instanttensor import Backend, BackendPolicy


@pytest.fixture
def experts(tmp_path):
    """A MoE-like checkpoint in two files: names that glob, exact and regex select differently."""
    torch.manual_seed(5)
    tensors = {"model.embed_tokens.weight": torch.randn(32, 16), "lm_head.weight": torch.randn(32, 16)}
    for layer in range(2):
        for expert in range(4):
            tensors[f"model.layers.{layer}.mlp.experts.{expert}.w1.weight"] = torch.randn(8, 16)
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = torch.randn(16)
    names = sorted(tensors)
    paths = [str(tmp_path / "model-00001-of-00002.safetensors"),
             str(tmp_path / "model-00002-of-00002.safetensors")]
    reference_save({n: tensors[n] for n in names[::2]}, paths[0])
    reference_save({n: tensors[n] for n in names[1::2]}, paths[1])
    return paths, tensors


def load(paths, **options):
    with instanttensor.safe_open(paths, framework="pt", device="cpu", **options) as f:
        return f, f.keys(), f.total_tensor_size, f.stats(), dict(f.tensors())


@pytest.mark.parametrize("mode,patterns,expected", [
    ("exact", ["lm_head.weight", "model.layers.1.mlp.experts.2.w1.weight", "not.a.tensor"],
     {"lm_head.weight", "model.layers.1.mlp.experts.2.w1.weight"}),
    ("glob", ["model.layers.*.mlp.experts.[02].w1.weight", "lm_head.weight"],
     {"model.layers.0.mlp.experts.0.w1.weight", "model.layers.0.mlp.experts.2.w1.weight",
      "model.layers.1.mlp.experts.0.w1.weight", "model.layers.1.mlp.experts.2.w1.weight",
      "lm_head.weight"}),
    ("glob", ["*layernorm*"], {"model.layers.0.input_layernorm.weight",
                               "model.layers.1.input_layernorm.weight"}),
    ("glob", ["LM_HEAD.weight", "model.layers.0"], set()),  # case-sensitive, whole name
    ("regex", [r"model\.layers\.1\..*", r"lm_head"],  # fullmatch: "lm_head" alone matches none
     {"model.layers.1.input_layernorm.weight"} | {
         f"model.layers.1.mlp.experts.{e}.w1.weight" for e in range(4)}),
    ("regex", [r"(?:model\.embed_tokens|lm_head)\.weight"],
     {"model.embed_tokens.weight", "lm_head.weight"}),
])
def test_each_match_mode_selects_whole_names_and_reads_only_them(experts, mode, patterns,
                                                                 expected):
    paths, tensors = experts
    _, keys, total, stats, loaded = load(paths, tensor_filter=patterns,
                                         tensor_name_match_mode=mode, backend="pread")
    assert set(keys) == expected and keys == sorted(expected)
    assert set(loaded) == expected
    assert total == sum(tensors[n].nbytes for n in expected)
    assert stats["bytes_read"] <= total + 2 * 4096  # only the selected byte ranges
    for name in expected:
        assert same_bytes(loaded[name], tensors[name]), name


def test_the_default_mode_is_glob_and_a_literal_pattern_is_an_exact_name(experts):
    paths, tensors = experts
    _, keys, *_ = load(paths, tensor_filter=["lm_head.weight", "model.layers.?.input_*"])
    assert keys == ["lm_head.weight", "model.layers.0.input_layernorm.weight",
                    "model.layers.1.input_layernorm.weight"]


def test_an_empty_filter_selects_nothing_and_reads_nothing(experts):
    paths, _ = experts
    f, keys, total, stats, loaded = load(paths, tensor_filter=[], tensor_name_match_mode="exact")
    assert keys == [] and total == 0 and loaded == {} and stats["bytes_read"] == 0
    with instanttensor.safe_open(paths, tensor_filter=[]) as f:
        assert f.offset_keys() == []
        with pytest.raises(KeyError):
            f.get_tensor("lm_head.weight")  # not selected


def test_a_filter_opens_and_parses_each_file_once(experts, tmp_path):
    # The names a filter is matched against come from headers that the open then takes over
    # (format/parsed_checkpoint.h): strace counts the opens naming each file.
    import shutil
    import subprocess
    import sys

    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    paths, tensors = experts
    script = tmp_path / "filtered.py"
    script.write_text("import sys, instanttensor\n"
                      "with instanttensor.safe_open(sys.argv[1:], tensor_filter=['*.w1.*']) as f:\n"
                      "    print(sum(1 for _ in f.tensors()))\n")
    trace = tmp_path / "trace.txt"
    run = subprocess.run(["strace", "-f", "-o", str(trace), "-e", "trace=open,openat",
                          sys.executable, str(script), *paths],
                         check=True, timeout=120, capture_output=True, text=True)
    assert int(run.stdout) == sum(".w1." in name for name in tensors)
    lines = trace.read_text().splitlines()
    for path in paths:
        opens = [line for line in lines if f'"{path}"' in line and "= -1" not in line]
        assert len(opens) == 1, opens


def test_filtered_out_names_are_unknown_to_random_access_and_metadata(experts):
    paths, tensors = experts
    with instanttensor.safe_open(paths, tensor_filter=["lm_head.weight"]) as f:
        assert same_bytes(f.get_tensor("lm_head.weight"), tensors["lm_head.weight"])
        with pytest.raises(KeyError, match="model.embed_tokens.weight"):
            f.get_tensor("model.embed_tokens.weight")
        with pytest.raises(KeyError):
            f.get_tensor_metadata("model.embed_tokens.weight")


@pytest.mark.parametrize("bad", [("lm_head.weight",), "lm_head.weight", {"lm_head.weight"},
                                 ["lm_head.weight", 3], [b"lm_head.weight"]])
def test_a_filter_that_is_not_a_list_of_str_is_a_type_error(experts, bad):
    with pytest.raises(TypeError, match="list of strings"):
        instanttensor.safe_open(experts[0], tensor_filter=bad)


def test_a_bad_mode_or_regex_is_a_value_error_naming_it(experts, tmp_path):
    paths, _ = experts
    with pytest.raises(ValueError, match="'fuzzy'"):
        instanttensor.safe_open(paths, tensor_filter=["x"], tensor_name_match_mode="fuzzy")
    with pytest.raises(ValueError, match="'Exact'"):  # modes are case-sensitive, as upstream
        instanttensor.safe_open(paths, tensor_name_match_mode="Exact")
    with pytest.raises(ValueError, match=r"'\(unclosed'"):
        instanttensor.safe_open(paths, tensor_filter=["(unclosed"], tensor_name_match_mode="regex")
    # Checked before any file is opened.
    with pytest.raises(ValueError, match="fuzzy"):
        instanttensor.safe_open(str(tmp_path / "missing.safetensors"), tensor_filter=["x"],
                                tensor_name_match_mode="fuzzy")


def test_keys_and_tensor_filter_together_is_a_value_error(experts):
    with pytest.raises(ValueError, match="not both"):
        instanttensor.safe_open(experts[0], keys=["lm_head.weight"], tensor_filter=["lm_head.*"])


def test_a_filter_sizes_the_borrow_pool_from_the_selected_tensors(tmp_path):
    big = {"big": torch.zeros(1 << 20), "small.a": torch.ones(256), "small.b": torch.ones(512)}
    path = str(tmp_path / "sizes.safetensors")
    reference_save(big, path)
    with instanttensor.safe_open(path, copy=False) as everything:
        full = everything.buffer_size
    with instanttensor.safe_open(path, copy=False, tensor_filter=["small.*"]) as selected:
        assert selected.buffer_size < full
        assert {n: t.clone() for n, t in selected.tensors()}.keys() == {"small.a", "small.b"}


# -- backends --------------------------------------------------------------------------------

EXPECTED_BACKEND = {  # our backend each upstream name runs on (stats()["backend"] starts with it)
    Backend.AIO: "pread+O_DIRECT",
    Backend.AIO_BUFFERED: "pread",
    Backend.URING: "io_uring+O_DIRECT",
    Backend.URING_BUFFERED: "io_uring",
    Backend.MMAP: "mmap",
    BackendPolicy.BUFFERED: "pread",
}


def test_the_enums_have_upstreams_members():
    assert list(Backend.__members__) == ["AIO", "AIO_BUFFERED", "URING", "URING_BUFFERED",
                                         "CUFILE", "MMAP"]
    assert list(BackendPolicy.__members__) == ["BUFFERED"]


def backend_of(stats_backend: str) -> str:
    # io_uring may be refused by the sandbox: the engine then says so and reads with pread.
    if "io_uring fallback" in stats_backend:
        return stats_backend.replace("pread", "io_uring", 1).split(" ")[0]
    return stats_backend.split(" ")[0]


@pytest.mark.parametrize("member", list(EXPECTED_BACKEND), ids=lambda m: m.name)
def test_every_member_loads_on_the_backend_it_maps_to(model_files, member):
    paths, tensors = model_files
    for backend in (member, [member]):
        # concurrency: the workers start even for this small checkpoint.
        _, _, _, stats, loaded = load(paths, backend=backend, concurrency=2)
        assert backend_of(stats["backend"]) == EXPECTED_BACKEND[member], stats["backend"]
        assert all(same_bytes(loaded[n], tensors[n]) for n in tensors)


def read_backend(backend: str) -> str:
    """stats()["backend"] without the note of a host iteration over views of the page cache."""
    return backend.split(" (iteration: ")[0]


def test_a_list_is_tried_in_order_and_cufile_is_skipped(model_files):
    paths, tensors = model_files
    _, _, _, stats, loaded = load(paths, backend=[Backend.CUFILE, Backend.MMAP, Backend.AIO])
    assert read_backend(stats["backend"]) == "mmap"
    _, _, _, stats, _ = load(paths, backend=[Backend.AIO_BUFFERED, Backend.MMAP],
                             concurrency=2)
    assert read_backend(stats["backend"]) == "pread"
    # Our names and upstream members in one list, and comma lists of either.
    _, _, _, stats, _ = load(paths, backend=["mmap", Backend.AIO])
    assert read_backend(stats["backend"]) == "mmap"
    _, _, _, stats, loaded = load(paths, backend="CUFILE, aio", concurrency=2)
    assert read_backend(stats["backend"]) == "pread+O_DIRECT"
    assert all(same_bytes(loaded[n], tensors[n]) for n in tensors)


def test_cufile_alone_is_a_clear_error(model_files):
    with pytest.raises(ValueError, match="GPUDirect Storage"):
        instanttensor.safe_open(model_files[0], backend=Backend.CUFILE)


@pytest.mark.parametrize("bad,error", [([], ValueError), (3, TypeError), ([Backend.AIO, 3], TypeError),
                                       ("floppy", ValueError), ({"AIO"}, TypeError)])
def test_bad_backend_arguments(model_files, bad, error):
    with pytest.raises(error):
        instanttensor.safe_open(model_files[0], backend=bad)


@pytest.mark.parametrize("value,expected", [
    ("BUFFERED", "pread"), ("URING,AIO", "io_uring+O_DIRECT"), ("AIO", "pread+O_DIRECT"),
    ("AIO_BUFFERED", "pread"), ("URING_BUFFERED", "io_uring"), ("MMAP", "mmap"),
    ("CUFILE,AIO", "pread+O_DIRECT"), ("URING, AIO", "io_uring+O_DIRECT"),
    ("mmap,AIO", "mmap"), ("direct", "pread+O_DIRECT")])
def test_instanttensor_backend_takes_upstreams_names_and_ours(model_files, monkeypatch, value,
                                                              expected):
    paths, tensors = model_files
    monkeypatch.setenv("INSTANTTENSOR_BACKEND", value)
    _, _, _, stats, loaded = load(paths, concurrency=2)
    assert backend_of(stats["backend"]) == expected, stats["backend"]
    assert all(same_bytes(loaded[n], tensors[n]) for n in tensors)


@pytest.mark.parametrize("value", ["CUFILE", "FLOPPY", ",", "URING;AIO"])
def test_bad_instanttensor_backend_values_name_the_variable(model_files, monkeypatch, value):
    monkeypatch.setenv("INSTANTTENSOR_BACKEND", value)
    with pytest.raises(ValueError, match="INSTANTTENSOR_BACKEND"):
        instanttensor.safe_open(model_files[0])


def test_the_recipes_environment_values_are_accepted(model_files, monkeypatch):
    paths, tensors = model_files
    for name, value in [("INSTANTTENSOR_CONCURRENCY", "1"), ("INSTANTTENSOR_IO_DEPTH", "3"),
                        ("INSTANTTENSOR_BUFFER_SIZE", str(64 << 20)),
                        ("INSTANTTENSOR_MAX_FREE_MEM_USAGE", "0.9"),
                        ("INSTANTTENSOR_CHUNK_SIZE", str(1 << 20))]:
        monkeypatch.setenv(name, value)
    _, _, _, _, loaded = load(paths)
    assert all(same_bytes(loaded[n], tensors[n]) for n in tensors)


# -- the rest of upstream's safe_open ----------------------------------------------------------

def test_upstreams_positional_order_and_a_list_left_as_given(model_files):
    paths, tensors = model_files
    given = list(reversed(paths))
    with instanttensor.safe_open(given, "pt", "cpu", None, buffer_size=1 << 20) as f:
        assert given == list(reversed(paths))  # upstream sorts the caller's list in place
        assert f.offset_keys()[0] in reference_load(paths[0])  # storage order: files sorted
        assert f.copy is True and f.buffer_size > 0
        loaded = dict(f.tensors())
    assert all(same_bytes(loaded[n], tensors[n]) for n in tensors)


def test_load_now_false_opens_at_enter(model_files, tmp_path):
    paths, tensors = model_files
    moved = tmp_path / "later.safetensors"
    f = instanttensor.safe_open(str(moved), framework="pt", device="cpu", load_now=False)
    os.rename(paths[0], moved)  # the file appears after construction: read at __enter__
    with f:
        assert set(f.keys()) == set(reference_load(str(moved)))
    # Never entered and closed: nothing was opened, nothing to use later.
    g = instanttensor.safe_open(str(moved), load_now=False)
    g.close()
    with pytest.raises(ValueError, match="closed"):
        g.keys()
    # A missing file is reported at __enter__, not at construction.
    h = instanttensor.safe_open(str(tmp_path / "missing.safetensors"), load_now=False)
    with pytest.raises(FileNotFoundError):
        with h:
            pass


def test_metadata_and_file_metadata(model_files, tmp_path):
    paths, _ = model_files
    with instanttensor.safe_open(paths) as f:
        assert f.metadata() == {"format": "pt"} and f.file_metadata == {"format": "pt"}
    bare = str(tmp_path / "bare.safetensors")
    reference_save({"x": torch.ones(2)}, bare)
    with instanttensor.safe_open(bare) as f:
        assert f.metadata() is None and f.file_metadata is None  # upstream: TypeError


def test_the_version_satisfies_what_vllm_requires():
    from packaging.requirements import Requirement
    from packaging.version import Version

    version = importlib.metadata.version("instanttensor")
    assert version == instanttensor.__version__
    assert Version(version) in Requirement("instanttensor>=0.2.2").specifier
    assert Version(version) in Requirement("instanttensor==0.2.2").specifier
    assert instanttensor.UPSTREAM_API_LEVEL == "0.2.2"
