"""The safetensors face (instanttensor, instanttensor.torch, instanttensor.numpy) against the
reference package as the oracle: names, bytes written, values read, errors raised."""

from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import instanttensor
import instanttensor.numpy
import instanttensor.torch
from conftest import same_bytes

FACES = [(safetensors, instanttensor), (safetensors.torch, instanttensor.torch),
         (safetensors.numpy, instanttensor.numpy)]

TORCH_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
                torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
                torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz,
                torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]
NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.uint64, np.int32, np.uint32,
                np.int16, np.uint16, np.int8, np.uint8, np.bool_, np.complex64]
METADATA = [None, {}, {"format": "pt"}, {"b": "2", "a": "1", "ünï": "cödé"}]


def public_names(module) -> set[str]:
    """Names a module itself defines for its users: not underscored, not an imported module, and
    not a helper imported from elsewhere (typing, os, collections)."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        home = getattr(value, "__module__", None) or ""
        if home.startswith("safetensors"):
            names.add(name)
    return names


@pytest.mark.parametrize("reference,ours", FACES, ids=lambda m: m.__name__)
def test_every_public_name_of_the_reference_is_ours(reference, ours):
    missing = public_names(reference) - set(dir(ours))
    assert not missing, f"{ours.__name__} lacks {sorted(missing)}"


@pytest.mark.parametrize("reference,ours", FACES, ids=lambda m: m.__name__)
def test_functions_take_the_reference_parameters(reference, ours):
    for name in public_names(reference):
        theirs = getattr(reference, name)
        if not inspect.isfunction(theirs):
            continue  # the Rust extension's functions carry no Python signature
        expected = list(inspect.signature(theirs).parameters)
        assert list(inspect.signature(getattr(ours, name)).parameters) == expected, name


def sample(dtype: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def assert_same_file(ours: bytes, theirs: bytes) -> None:
    """Byte-identical, except where the reference itself is not deterministic: it writes several
    metadata entries in its hash map's order, which changes from process to process; there the
    header must hold the same JSON at the same length and the data must be identical."""
    if ours == theirs:
        return
    length = int.from_bytes(theirs[:8], "little")
    assert ours[:8] == theirs[:8] and ours[8 + length:] == theirs[8 + length:]
    header = json.loads(theirs[8:8 + length])
    assert len(header.get("__metadata__", {})) > 1, "differs where the reference is deterministic"
    assert json.loads(ours[8:8 + length]) == header


@pytest.mark.parametrize("metadata", METADATA)
def test_torch_save_and_save_file_are_byte_identical_for_every_dtype(tmp_path, metadata):
    torch.manual_seed(1)
    tensors = {f"t_{str(d).removeprefix('torch.')}": sample(d) for d in TORCH_DTYPES}
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 3)
    expected = safetensors.torch.save(tensors, metadata=metadata)
    assert_same_file(instanttensor.torch.save(tensors, metadata=metadata), expected)
    instanttensor.torch.save_file(tensors, tmp_path / "ours.safetensors", metadata=metadata)
    assert_same_file((tmp_path / "ours.safetensors").read_bytes(), expected)
    assert instanttensor.save_file is instanttensor.torch.save_file


@pytest.mark.parametrize("metadata", METADATA)
def test_numpy_save_and_save_file_are_byte_identical_for_every_dtype(tmp_path, metadata):
    rng = np.random.default_rng(2)
    arrays = {f"a_{np.dtype(d).name}": rng.integers(0, 255, (3, 5)).astype(d)
              for d in NUMPY_DTYPES}
    arrays["big_endian"] = np.arange(6, dtype=">i4").reshape(2, 3)
    arrays["fortran"] = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    arrays["scalar"] = np.asarray(False)
    expected = safetensors.numpy.save(
        {k: v if v.flags.c_contiguous else np.ascontiguousarray(v) for k, v in arrays.items()},
        metadata=metadata)
    assert_same_file(instanttensor.numpy.save(arrays, metadata=metadata), expected)
    instanttensor.numpy.save_file(arrays, tmp_path / "np.safetensors", metadata=metadata)
    assert_same_file((tmp_path / "np.safetensors").read_bytes(), expected)
    loaded = instanttensor.numpy.load_file(tmp_path / "np.safetensors")
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype.newbyteorder("=")
        assert loaded[name].shape == array.shape, name  # 0-d stays 0-d
        np.testing.assert_array_equal(loaded[name], array)


def test_load_of_bytes_matches_the_reference():
    tensors = {f"t{i}": sample(d) for i, d in enumerate(TORCH_DTYPES)}
    tensors["empty"] = torch.zeros(2, 0)
    data = safetensors.torch.save(tensors)
    ours = instanttensor.torch.load(data)  # every dtype (the reference's load lacks F8_E8M0, F4)
    assert set(ours) == set(tensors)
    for name, tensor in tensors.items():
        assert same_bytes(ours[name], tensor), name
        assert ours[name].untyped_storage().nbytes() == tensor.nbytes  # each owns its bytes
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.asarray(True)}
    data = safetensors.numpy.save(arrays)
    for name, array in instanttensor.numpy.load(bytearray(data)).items():
        np.testing.assert_array_equal(array, arrays[name])


def test_deserialize_matches_the_reference():
    data = safetensors.torch.save({"b": torch.arange(6, dtype=torch.int16).reshape(2, 3),
                                   "a": torch.ones(2, dtype=torch.bfloat16)},
                                  metadata={"k": "v"})
    ours = dict(instanttensor.deserialize(data))
    theirs = dict(safetensors.deserialize(data))
    assert ours == theirs
    assert isinstance(ours["a"]["data"], bytearray)


@pytest.mark.parametrize("data", [b"", b"\x01", b"\xff" * 8, b"\x10\x00\x00\x00\x00\x00\x00\x00{}",
                                  b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}"])
def test_malformed_bytes_raise_as_the_reference(data):
    with pytest.raises(safetensors.SafetensorError):
        safetensors.torch.load(data)
    for load in (instanttensor.torch.load, instanttensor.numpy.load, instanttensor.deserialize):
        with pytest.raises(instanttensor.SafetensorError) as info:
            load(data)
        assert isinstance(info.value, ValueError)


def test_tensor_spec_and_serialize_file(tmp_path):
    array = np.arange(8, dtype=np.uint8).reshape(2, 4)
    packed = torch.arange(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 2)
    specs = {}
    for module in (safetensors, instanttensor):
        specs[module] = {
            "a": module.TensorSpec(dtype="uint8", shape=array.shape, data_ptr=array.ctypes.data,
                                   data_len=array.nbytes),
            "f4": module.TensorSpec(dtype="float4_e2m1fn_x2", shape=packed.shape,
                                    data_ptr=packed.data_ptr(), data_len=4)}
    for name in ("a", "f4"):
        ours, theirs = specs[instanttensor][name], specs[safetensors][name]
        assert (ours.dtype, ours.shape, ours.data_ptr, ours.data_len) == \
               (theirs.dtype, theirs.shape, theirs.data_ptr, theirs.data_len)
    assert specs[instanttensor]["f4"].shape == [2, 4]  # logical: two values per byte
    numpy_ints = instanttensor.TensorSpec(dtype="uint8", shape=(np.int64(2), np.int32(4)),
                                          data_ptr=np.uint64(array.ctypes.data),
                                          data_len=np.int64(8))
    assert numpy_ints.shape == [2, 4] and numpy_ints.data_len == 8
    expected = safetensors.serialize(specs[safetensors], metadata={"m": "1"})
    assert instanttensor.serialize(specs[instanttensor], metadata={"m": "1"}) == expected
    instanttensor.serialize_file(specs[instanttensor], tmp_path / "s.safetensors", {"m": "1"})
    assert (tmp_path / "s.safetensors").read_bytes() == expected
    with pytest.raises(instanttensor.SafetensorError, match="Unknown dtype"):
        instanttensor.TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=4)
    with pytest.raises(TypeError):
        instanttensor.serialize({"raw": {"dtype": "float32", "shape": [1], "data_ptr": 0,
                                         "data_len": 0}})
    wrong_size = instanttensor.TensorSpec(dtype="float32", shape=[3], data_ptr=array.ctypes.data,
                                          data_len=8)
    with pytest.raises(instanttensor.SafetensorError, match="does not match shape"):
        instanttensor.serialize({"w": wrong_size})


def test_storage_ptr_and_size_match_the_reference():
    base = torch.arange(10, dtype=torch.float32)
    for tensor in (base, base[3:], torch.empty(2, 2, device="meta"), torch.zeros(0)):
        for name in ("storage_ptr", "storage_size"):
            assert getattr(instanttensor.torch, name)(tensor) == \
                getattr(safetensors.torch, name)(tensor), (name, tensor)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = self.a
        self.c = torch.nn.Linear(6, 3)


def test_save_model_and_load_model_with_tied_weights(tmp_path):
    torch.manual_seed(3)
    model = Tied()
    instanttensor.torch.save_model(model, tmp_path / "ours.safetensors")
    safetensors.torch.save_model(model, tmp_path / "ref.safetensors")
    assert safetensors.torch.load_file(tmp_path / "ours.safetensors").keys() == \
        safetensors.torch.load_file(tmp_path / "ref.safetensors").keys()
    with instanttensor.safe_open(tmp_path / "ours.safetensors") as f:
        assert f.metadata() == {"b.weight": "a.weight", "b.bias": "a.bias"}
    for saved in ("ours", "ref"):
        fresh = Tied()
        missing, unexpected = instanttensor.torch.load_model(fresh, tmp_path / f"{saved}.safetensors")
        assert (set(missing), unexpected) == (set(), [])
        assert fresh.b.weight is fresh.a.weight  # still tied
        for name, tensor in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[name], tensor), name
    untied = torch.nn.Module()
    untied.a, untied.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
    for module in (safetensors.torch, instanttensor.torch):
        with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "b.bias"'):
            module.load_model(untied, tmp_path / "ours.safetensors")
    missing, unexpected = instanttensor.torch.load_model(untied, tmp_path / "ours.safetensors",
                                                         strict=False)
    assert set(missing) == {"b.weight", "b.bias"} and set(unexpected) == {"c.weight", "c.bias"}


def test_a_meta_tensor_is_never_saved_silently(tmp_path):
    path = tmp_path / "keep.safetensors"
    instanttensor.save_file({"old": torch.ones(3)}, path)
    before = path.read_bytes()
    tensors = {"x": torch.zeros(2), "m": torch.empty(4, device="meta")}
    for save in (lambda: instanttensor.save_file(tensors, path),
                 lambda: instanttensor.torch.save(tensors)):
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor `m`") as info:
            save()  # the reference's type (torch's), a RuntimeError too
        assert isinstance(info.value, RuntimeError)
        assert isinstance(info.value, instanttensor.SafetensorError)
    # The operator itself, where the fake (Meta) kernel used to return without writing.
    with pytest.raises(ValueError, match="tensor 'm': Cannot copy out of meta tensor"):
        torch.ops.instanttensor.save_file([tensors["x"], tensors["m"]], ["x", "m"], str(path),
                                          [], [], False)
    with pytest.raises(ValueError, match="tensor 'old'.*meta tensor"):
        torch.ops.instanttensor.load_into_([torch.empty(3, device="meta")], [str(path)], ["old"])
    assert path.read_bytes() == before
    assert list(path.parent.iterdir()) == [path]  # no temporary left behind
    # Tracing (fake tensors, or no tensor at all) never runs the real kernel.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
        torch.ops.instanttensor.save_file([fake], ["f"], str(path), [], [], False)
        torch.ops.instanttensor.save_file([], [], str(path), [], [], False)
        torch.ops.instanttensor.load_into_([], [str(path)], [])
    assert path.read_bytes() == before


def test_save_file_under_torch_compile_is_not_eliminated(tmp_path):
    path = str(tmp_path / "compiled.safetensors")
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(x):
        torch.ops.instanttensor.save_file([x * 2], ["doubled"], path, [], [], False)
        return x + 1

    step(torch.ones(3))
    assert torch.equal(instanttensor.load_file(path)["doubled"], torch.full((3,), 2.0))


def test_numpy_framework_everywhere(tmp_path):
    path = tmp_path / "n.safetensors"
    safetensors.torch.save_file({"w": torch.arange(12.0).reshape(3, 4)}, path)
    safetensors.torch.save_file({"h": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "h.safetensors")
    for framework in ("np", "numpy"):
        with instanttensor.safe_open(path, framework=framework) as f, \
                safetensors.safe_open(path, framework=framework) as ref:
            for got in (f.get_tensor("w"), f.get_slice("w")[1:3], f.get_tensors()["w"],
                        dict(f.tensors())["w"]):
                assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(f.get_tensor("w"), ref.get_tensor("w"))
            np.testing.assert_array_equal(f.get_slice("w")[:, 1:3], ref.get_slice("w")[:, 1:3])
        with instanttensor.safe_open(tmp_path / "h.safetensors", framework=framework) as f:
            for call in (lambda: f.get_tensor("h"), f.get_tensors, lambda: f.get_slice("h")[:1]):
                with pytest.raises(TypeError, match="'h' has dtype bfloat16"):
                    call()
    with pytest.raises(ValueError, match="Device cuda is not supported for framework np"):
        instanttensor.safe_open(path, framework="np", device="cuda")
    for framework in ("pt", "torch", "pytorch"):
        with instanttensor.safe_open(path, framework=framework) as f:
            assert isinstance(f.get_tensor("w"), torch.Tensor)
    with pytest.raises(instanttensor.SafetensorError, match="'pt'.*'np'"):
        instanttensor.safe_open(path, framework="flax")


def test_numpy_iteration_streams_arrays_that_own_their_bytes(tmp_path):
    # Each array is handed out while the pass is at its tensor (not after every tensor is
    # loaded), owning a copy: nothing is kept past its step, so no view is leased or copied out.
    path = tmp_path / "many.safetensors"
    tensors = {f"t{i:02d}": torch.full((256,), float(i)) for i in range(16)}
    safetensors.torch.save_file(tensors, path)
    with instanttensor.safe_open(path, framework="np") as f:
        stream = f.tensors()
        name, first = next(stream)
        assert name == "t00" and f.stats()["tensors_loaded"] == 1
        arrays = {name: first, **dict(stream)}
        assert f.stats()["leased_views"] == 0 and f.stats()["materializations"] == 0
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(arrays[name], tensor.numpy())
    arrays["t03"][0] = -1.0  # its own bytes: the file and the other arrays are untouched
    assert arrays["t04"][0] == 4.0
    with instanttensor.safe_open(path, framework="np") as f:
        assert f.get_tensor("t03")[0] == 3.0


def test_get_tensors_and_meta_device(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {"a": torch.randn(4, 3), "b": torch.arange(5)}
    safetensors.torch.save_file(tensors, path)
    with instanttensor.safe_open(path) as f, safetensors.safe_open(path, framework="pt") as ref:
        ours, theirs = f.get_tensors(), ref.get_tensors()
        assert list(ours) == list(theirs)
        for name in tensors:
            assert same_bytes(ours[name], theirs[name])
    with instanttensor.safe_open(path, device="meta") as f:  # shapes only, no byte read
        for got in (f.get_tensor("a"), f.get_tensors()["a"], dict(f.tensors())["a"]):
            assert got.is_meta and got.shape == (4, 3) and got.dtype == torch.float32
        assert f.get_slice("a")[1:3].shape == (2, 3)
        assert f.stats()["bytes_read"] == 0


@pytest.mark.parametrize("device", ["cuda", "cuda:1", 0, "npu:0", "mlu", "musa:0", "xpu"])
def test_an_absent_device_opens_and_fails_at_the_first_tensor(tmp_path, device):
    path = tmp_path / "d.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2, 3)}, path)
    try:
        torch.empty(1, device=device)
        pytest.skip(f"{device} is present here")
    except (RuntimeError, AssertionError):
        pass
    with instanttensor.safe_open(path, device=device) as f:  # lazy, as the reference
        assert f.keys() == ["a"] and f.get_slice("a").get_shape() == [2, 3]
        for _ in range(2):  # each time a new exception of the same type
            with pytest.raises(ValueError, match="not") as info:
                f.get_tensor("a")
            assert isinstance(info.value, instanttensor.SafetensorError)


def test_errors_are_safetensor_errors_and_their_builtin_types(tmp_path):
    path = tmp_path / "e.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2, 2)}, path)
    with instanttensor.safe_open(path) as f:
        with pytest.raises(KeyError) as info:
            f.get_tensor("nope")
        assert isinstance(info.value, instanttensor.SafetensorError)
    with pytest.raises(FileNotFoundError) as info:
        instanttensor.safe_open(tmp_path / "absent.safetensors")
    assert isinstance(info.value, instanttensor.SafetensorError)
    assert str(info.value) == f"No such file or directory: {tmp_path / 'absent.safetensors'}"
    (tmp_path / "bad.safetensors").write_bytes(b"\x02" + b"\x00" * 7 + b"{x")
    with pytest.raises(ValueError) as info:
        instanttensor.load_file(tmp_path / "bad.safetensors")
    assert isinstance(info.value, instanttensor.SafetensorError)
    with pytest.raises(TypeError) as info:
        instanttensor.save_file({1: torch.ones(1)}, tmp_path / "n.safetensors")
    assert isinstance(info.value, instanttensor.SafetensorError)
    for call in (lambda: instanttensor.safe_open(path, device="foo"),
                 lambda: instanttensor.safe_open(path, chunk_size=-1),
                 lambda: instanttensor.safe_open([]),
                 lambda: instanttensor.safe_open(path, backend=[])):
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, instanttensor.SafetensorError)


@pytest.mark.parametrize("index", [(slice(2, None), -6), [0, 1], (slice(2, None), 20),
                                   slice(None, 20), (slice(None), slice(None, 20)),
                                   (Ellipsis, Ellipsis), slice(0, 4, 0), (1, 2, 3), "a"])
def test_numpy_slice_errors_say_what_the_reference_says(tmp_path, index):
    # framework="np" slices by the reference's own rules (framework="pt" by torch's: test_slices).
    path = tmp_path / "s.safetensors"
    safetensors.torch.save_file({"a": torch.randn(10, 5)}, path)
    with safetensors.safe_open(path, framework="np") as ref:
        with pytest.raises(safetensors.SafetensorError) as theirs:
            ref.get_slice("a")[index]
    with instanttensor.safe_open(path, framework="np") as f:
        with pytest.raises(instanttensor.SafetensorError) as ours:
            f.get_slice("a")[index]
    assert str(ours.value) == str(theirs.value)


def test_backend_names_of_the_reference(tmp_path):
    path = tmp_path / "b.safetensors"
    tensors = {"a": torch.randn(3, 3)}
    safetensors.torch.save_file(tensors, path)
    for backend in ("mmap", "pread"):
        loaded = instanttensor.torch.load_file(path, backend=backend)
        assert same_bytes(loaded["a"], tensors["a"])
        assert instanttensor.numpy.load_file(path, backend=backend)["a"].shape == (3, 3)
    with pytest.raises(ValueError, match="backend"):
        instanttensor.torch.load_file(path, backend="not_a_backend")


def test_safe_open_handle_opens_the_file_behind_a_file_object(tmp_path):
    path = tmp_path / "h.safetensors"
    safetensors.torch.save_file({"a": torch.arange(4)}, path)
    with open(path, "rb") as handle, instanttensor._safe_open_handle(handle, "pt") as f:
        assert torch.equal(f.get_tensor("a"), torch.arange(4))
    with pytest.raises(ValueError, match="fileno"):
        instanttensor._safe_open_handle(object(), "pt")
    assert os.path.exists(path)
