"""load_into: tensors the caller owns, filled in place, in one pass; every error before a byte."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import instanttensor
from conftest import same_bytes
from test_parity import DTYPES, random_tensor

CMAKE_BUILD_DIR = os.environ.get("INSTANTTENSOR_CMAKE_BUILD_DIR")
BACKENDS = [None, "pread", "uring", "mmap", "staged"]


def options_for(backend):
    if backend == "staged":  # the accelerator path (pinned staging -> copy), run on the CPU
        return {"_force_staging": True, "staging_size": 32 << 10, "chunk_size": 4096}
    return {} if backend is None else {"backend": backend}


def empty_like_all(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        out[name] = torch.full(tensor.shape, 0, dtype=torch.uint8).view(torch.uint8)
        out[name] = torch.empty(tensor.shape, dtype=tensor.dtype)
        out[name].view(-1).view(torch.uint8)[:] = 0xA5 if tensor.numel() else 0
    return out


def misaligned_file(path: str) -> dict[str, torch.Tensor]:
    """A file whose data starts at an odd offset (legal; odd for every element type)."""
    x = torch.arange(1000, dtype=torch.float32)
    y = torch.arange(7, dtype=torch.int16)
    header = {"y": {"dtype": "I16", "shape": [7], "data_offsets": [0, 14]},
              "x": {"dtype": "F32", "shape": [1000], "data_offsets": [14, 4014]}}
    text = json.dumps(header).encode() + b" "  # length not a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(y.numpy().tobytes() + x.numpy().tobytes())
    return {"x": x, "y": y}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda n: n != "__metadata__"),
                            st.tuples(st.sampled_from(DTYPES),
                                      st.lists(st.integers(0, 40), max_size=3),
                                      st.integers(0, 2**31)), min_size=1, max_size=10),
       files=st.integers(1, 3), backend=st.sampled_from(BACKENDS))
def test_generated_checkpoints_fill_in_place_like_the_reference(tmp_path_factory, spec, files,
                                                                backend):
    folder = tmp_path_factory.mktemp("into")
    tensors = {n: random_tensor(d, shape, seed) for n, (d, shape, seed) in spec.items()}
    shards = [{} for _ in range(files)]
    for index, name in enumerate(sorted(tensors)):
        shards[index % files][name] = tensors[name]
    paths = []
    for index, shard in enumerate(shards):
        if shard:
            paths.append(str(folder / f"s{index}.safetensors"))
            reference_save(shard, paths[-1])
    expected = {}
    for path in paths:
        expected.update(reference_load(path))
    destinations = empty_like_all(tensors)
    pointers = {n: t.data_ptr() for n, t in destinations.items()}
    result = instanttensor.load_into(destinations, paths, **options_for(backend))
    assert result == ([], [])
    for name, tensor in destinations.items():
        assert tensor.data_ptr() == pointers[name], name  # in place
        assert same_bytes(tensor, expected[name]), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_offsets_several_files_and_keys(tmp_path, backend, model_files):
    paths, tensors = model_files
    odd = str(tmp_path / "odd.safetensors")
    odd_tensors = misaligned_file(odd)
    destinations = {n: torch.empty_like(t) for n, t in {**tensors, **odd_tensors}.items()}
    instanttensor.load_into(destinations, paths + [odd], **options_for(backend))
    for name, tensor in {**tensors, **odd_tensors}.items():
        assert torch.equal(destinations[name], tensor), name
    # keys= selects what the checkpoint offers; strict then holds against the selection.
    chosen = {"embed.weight": torch.empty_like(tensors["embed.weight"]),
              "layers.5.mlp.weight": torch.empty_like(tensors["layers.5.mlp.weight"])}
    with instanttensor.safe_open(paths, keys=list(chosen), **options_for(backend)) as f:
        assert f.load_into(chosen) == ([], [])
    for name, tensor in chosen.items():
        assert torch.equal(tensor, tensors[name])


def test_a_state_dict_is_filled_in_place(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    path = str(tmp_path / "model.safetensors")
    reference_save({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    weight = fresh[0].weight
    instanttensor.load_into(fresh.state_dict(), path)
    assert fresh[0].weight is weight  # the parameter object itself was filled
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    x = torch.randn(3, 16)
    assert torch.equal(model(x), fresh(x))


def test_non_contiguous_destinations_are_filled(model_files):
    paths, tensors = model_files
    transposed = torch.empty(32, 64, dtype=torch.bfloat16).t()  # embed.weight is 64 x 32
    strided = torch.empty(32, 2)[:, 0]  # layers.0.norm.weight: 32 elements, stride 2
    with instanttensor.safe_open(paths) as f:
        result = f.load_into({"embed.weight": transposed, "layers.0.norm.weight": strided},
                             strict=False)
    assert torch.equal(transposed, tensors["embed.weight"])
    assert torch.equal(strided, tensors["layers.0.norm.weight"])
    assert result.missing_keys == [] and "lm_head.weight" in result.unexpected_keys


@pytest.mark.parametrize("backend", ["direct", "uring"])
def test_cold_reads_go_straight_into_a_congruent_destination(tmp_path, backend):
    """O_DIRECT for the whole blocks of the destination, the two edges buffered: 3 requests."""
    path = str(tmp_path / "big.safetensors")
    tensor = torch.arange(64 * 1024, dtype=torch.float32)  # 256 KiB
    reference_save({"t": tensor}, path)
    with open(path, "rb") as f:
        data_start = 8 + struct.unpack("<Q", f.read(8))[0]
    with instanttensor.safe_open(path, backend=backend, chunk_size=1 << 20) as f:
        f.get_tensor_metadata("t")
        list(f.tensors())  # start the backend and learn whether O_DIRECT was granted
        stats = f.stats()
        if "O_DIRECT" not in stats["backend"] or "refused" in stats["backend"]:
            pytest.skip(f"O_DIRECT is not available here ({stats['backend']})")
        # A destination whose address agrees with the file offset modulo 4096.
        backing = torch.empty(tensor.nbytes + 8192, dtype=torch.uint8)
        shift = (data_start - backing.data_ptr()) % 4096
        destination = backing[shift:shift + tensor.nbytes].view(torch.float32)
        assert (destination.data_ptr() - data_start) % 4096 == 0
        before = f.stats()
        f.load_into({"t": destination})
        after = f.stats()
    assert torch.equal(destination, tensor)
    assert after["read_requests"] - before["read_requests"] == 3
    assert after["bytes_read"] - before["bytes_read"] == tensor.nbytes  # no widening, one pass


def test_wrong_shape_or_dtype_names_the_tensor_and_writes_nothing(model_files):
    paths, tensors = model_files
    for bad_name, bad in [("layers.1.attn.weight", torch.empty(32, 31)),
                          ("layers.1.attn.weight", torch.empty(32, 32, dtype=torch.float64)),
                          ("layers.1.attn.weight", torch.empty(1024))]:
        destinations = {n: torch.zeros_like(t) for n, t in tensors.items()}
        destinations[bad_name] = bad
        with pytest.raises(ValueError, match=r"tensor 'layers\.1\.attn\.weight'.*the file has"):
            instanttensor.load_into(destinations, paths)
        for name, tensor in destinations.items():
            if name != bad_name:
                assert not tensor.any(), f"{name} was written before validation failed"


def test_names_on_one_side_are_a_key_error_listing_them_unless_not_strict(model_files):
    paths, tensors = model_files
    destinations = {n: torch.zeros_like(t) for n, t in tensors.items() if n != "lm_head.weight"}
    destinations["extra.bias"] = torch.zeros(3)
    with pytest.raises(KeyError, match=r"1 destination\(s\) with no tensor in the checkpoint: "
                                       r"extra\.bias.*1 tensor\(s\) of the checkpoint with no "
                                       r"destination: lm_head\.weight"):
        instanttensor.load_into(destinations, paths)
    assert not destinations["embed.weight"].any()
    result = instanttensor.load_into(destinations, paths, strict=False)
    assert result.missing_keys == ["extra.bias"] and result.unexpected_keys == ["lm_head.weight"]
    assert torch.equal(destinations["embed.weight"], tensors["embed.weight"])
    assert not destinations["extra.bias"].any()


def test_overlapping_or_expanded_destinations_are_refused(model_files):
    paths, tensors = model_files
    block = torch.zeros(2 * 32 * 32)
    shared = {"layers.0.attn.weight": block[:1024].view(32, 32),
              "layers.1.attn.weight": block[1000:2024].view(32, 32)}
    with pytest.raises(ValueError, match="shares memory with the destination of"):
        instanttensor.load_into(shared, paths, strict=False)
    assert not block.any()
    expanded = {"layers.0.norm.weight": torch.zeros(1).expand(32)}
    with pytest.raises(ValueError, match=r"tensor 'layers\.0\.norm\.weight'.*elements overlap"):
        instanttensor.load_into(expanded, paths, strict=False)
    with pytest.raises(TypeError, match="mapping"):
        instanttensor.load_into([torch.zeros(1)], paths)
    with pytest.raises(ValueError, match="meta tensor"):
        instanttensor.load_into({"layers.0.norm.weight": torch.empty(32, device="meta")}, paths,
                                strict=False)


def test_the_operator_under_compile_and_torchscript(model_files):
    paths, tensors = model_files
    names = ["embed.weight", "layers.2.mlp.weight"]

    def fill_and_use(a: torch.Tensor, b: torch.Tensor, files: list[str], keys: list[str]):
        # TorchScript tracks the write on the list, not on the tensors put into it: read the
        # filled tensors through the list (README).
        destinations = [a, b]
        torch.ops.instanttensor.load_into_(destinations, files, keys)
        return destinations[0].float().sum() + destinations[1].float().sum()

    expected = tensors[names[0]].float().sum() + tensors[names[1]].float().sum()
    compiled = torch.compile(fill_and_use, fullgraph=True)
    a, b = (torch.zeros_like(tensors[n]) for n in names)
    assert torch.allclose(compiled(a, b, paths, names), expected)
    assert torch.equal(a, tensors[names[0]]) and torch.equal(b, tensors[names[1]])
    scripted = torch.jit.script(fill_and_use)
    a, b = (torch.zeros_like(tensors[n]) for n in names)
    assert torch.allclose(scripted(a, b, paths, names), expected)
    assert torch.equal(a, tensors[names[0]]) and torch.equal(b, tensors[names[1]])
    schema = torch.ops.instanttensor.load_into_.default._schema
    assert schema.arguments[0].alias_info.is_write  # the mutation is in the schema


def test_an_injected_read_fault_names_the_tensor_and_the_next_load_works(model_files):
    library = os.path.join(CMAKE_BUILD_DIR or "", "libinstanttensor_testing.so")
    if not CMAKE_BUILD_DIR or not os.path.exists(library):
        pytest.skip("needs the CMake build's test-only library (INSTANTTENSOR_CMAKE_BUILD_DIR)")
    torch.ops.load_library(library)
    paths, tensors = model_files
    for backend in [None, "pread", "direct", "mmap", "staged"]:  # every route of load_into
        destinations = {n: torch.zeros_like(t) for n, t in tensors.items()}
        torch.ops.instanttensor_testing.arm_read_fault(3, 5)  # the 3rd read: EIO
        try:
            with pytest.raises(OSError, match=r"\.safetensors: tensor '.*': read failed: "
                                              r"Input/output error"):
                instanttensor.load_into(destinations, paths, **options_for(backend))
        finally:
            torch.ops.instanttensor_testing.disarm_faults()
        instanttensor.load_into(destinations, paths, **options_for(backend))
        for name, tensor in tensors.items():
            assert torch.equal(destinations[name], tensor), (backend, name)


def test_staging_size_sizes_the_bounce_ring_and_is_checked(model_files):
    """staging_size given at open sizes load_into's ring on every route (never silently
    replaced by the default), and a size below the minimum is refused naming it."""
    paths, tensors = model_files
    destinations = {n: torch.zeros_like(t) for n, t in tensors.items()}
    with instanttensor.safe_open(paths, staging_size=16 << 10) as f:
        with pytest.raises(ValueError, match=r"staging_size=16384 bytes is below"):
            f.load_into(destinations)
    assert not destinations["embed.weight"].any()
    with instanttensor.safe_open(paths, backend="direct", staging_size=32 << 10) as f:
        f.load_into(destinations)
    for name, tensor in tensors.items():
        assert torch.equal(destinations[name], tensor), name
