"""torch.ops / torch.classes use: torch.compile, opcheck, TorchScript, threads."""

from __future__ import annotations

import threading
from typing import List

import pytest
import torch

import instanttensor
from conftest import same_bytes


def test_load_tensors_op_returns_owned_tensors_in_name_order(model_files):
    paths, tensors = model_files
    names = ["lm_head.weight", "embed.weight", "layers.3.norm.weight"]
    out = torch.ops.instanttensor.load_tensors(paths, names, torch.device("cpu"))
    assert len(out) == 3
    for name, tensor in zip(names, out):
        assert same_bytes(tensor, tensors[name])
        assert tensor.is_contiguous()
        assert tensor.untyped_storage().nbytes() == tensor.nbytes
    assert len({t.untyped_storage().data_ptr() for t in out}) == 3


def test_load_tensors_maps_errors(model_files):
    paths, _ = model_files
    with pytest.raises(RuntimeError, match="nope"):
        torch.ops.instanttensor.load_tensors(paths, ["nope"], torch.device("cpu"))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_matches_eager(model_files, dynamic):
    paths, tensors = model_files
    torch._dynamo.reset()

    def forward(x: torch.Tensor) -> torch.Tensor:
        w, b = torch.ops.instanttensor.load_tensors(
            paths, ["layers.0.attn.weight", "layers.0.norm.weight"], torch.device("cpu"))
        return torch.relu(x @ w.t() + b)

    x = torch.randn(5, 32)
    # The expected value comes from the reference tensors, not from the op under test.
    expected = torch.relu(x @ tensors["layers.0.attn.weight"].t() + tensors["layers.0.norm.weight"])
    assert torch.allclose(forward(x), expected)
    compiled = torch.compile(forward, fullgraph=True, dynamic=dynamic, backend="inductor")
    assert torch.allclose(compiled(x), expected)
    assert compiled(torch.randn(7, 32)).shape == (7, 32)  # another batch size still runs


def test_fake_kernel_reads_only_headers(model_files):
    from torch._subclasses.fake_tensor import FakeTensorMode

    paths, tensors = model_files
    with FakeTensorMode():
        out = torch.ops.instanttensor.load_tensors(paths, ["embed.weight"], torch.device("cpu"))
    assert out[0].shape == tensors["embed.weight"].shape
    assert out[0].dtype == torch.bfloat16


@pytest.mark.parametrize("op", ["load_tensors", "save_file", "load_into_"])
def test_each_fake_kernel_is_registered_as_its_ops_meta_kernel(op):
    qualname = f"instanttensor::{op}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta")
    assert torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is not None


def test_a_torch_without_the_fake_registry_takes_register_fake(monkeypatch):
    """The import skips register_fake's caller lookup through torch's registry; a torch
    without that registry must still get the kernels, through the public call."""
    from instanttensor import _fake

    public_calls = []

    def register_fake(qualname):
        public_calls.append(qualname)
        return lambda kernel: kernel

    monkeypatch.setattr(torch._library, "simple_registry", None)
    monkeypatch.setattr(torch.library, "register_fake", register_fake)
    _fake._register_fake("instanttensor::save_file")(_fake._save_file_fake)
    assert public_calls == ["instanttensor::save_file"]


def test_real_kernel_rechecks_a_changed_file(model_files):
    paths, _ = model_files
    torch._dynamo.reset()

    def forward() -> torch.Tensor:
        (w,) = torch.ops.instanttensor.load_tensors(paths, ["embed.weight"], torch.device("cpu"))
        return w.float().sum()

    compiled = torch.compile(forward, fullgraph=True)
    compiled()
    instanttensor.save_file({"embed.weight": torch.zeros(3)}, paths[0])
    # The kernel reads the new header; inductor's output check then refuses the changed shape,
    # naming the op (torch 2.13: "wrong number of dimensions1 for op: ...load_tensors.default").
    with pytest.raises(AssertionError, match=r"instanttensor\.load_tensors"):
        compiled()


@torch.jit.script
def scripted_load_file(file: str) -> List[str]:
    names, tensors = torch.ops.instanttensor.load_file(file, torch.device("cpu"))
    return [name + ":" + str(tensor.numel()) for name, tensor in zip(names, tensors)]


def test_load_file_op_from_torchscript_in_storage_order(model_files):
    paths, tensors = model_files
    names, loaded = torch.ops.instanttensor.load_file(paths[0], torch.device("cpu"))
    with instanttensor.safe_open(paths[0]) as f:
        assert names == f.offset_keys()
    for name, tensor in zip(names, loaded):
        assert same_bytes(tensor, tensors[name])
    assert scripted_load_file(paths[0]) == [f"{n}:{tensors[n].numel()}" for n in names]
    with pytest.raises(RuntimeError, match="nope.safetensors"):
        torch.ops.instanttensor.load_file(paths[0] + ".nope.safetensors", torch.device("cpu"))


def test_opcheck(model_files):
    paths, _ = model_files
    torch.library.opcheck(
        torch.ops.instanttensor.load_tensors.default,
        (paths, ["embed.weight", "layers.0.attn.weight"], torch.device("cpu")),
    )


@torch.jit.script
def scripted_sum(files: List[str], copy: bool) -> float:
    loader = torch.classes.instanttensor.Loader(files, torch.device("cpu"), copy)
    total = 0.0
    count = 0
    done = False
    while not done:
        item = loader.next()
        if item is not None:  # TorchScript refines Optional only inside the branch
            name, tensor = item
            total += float(tensor.float().sum().item())
            count += 1
        else:
            done = True
    loader.close()
    return total + 0.0 * count


def test_torchscript_iteration_matches_eager(model_files):
    paths, tensors = model_files
    expected = sum(float(t.float().sum()) for t in tensors.values())
    for copy in (True, False):
        assert scripted_sum(paths, copy) == pytest.approx(expected, rel=1e-5)


def test_loader_class_from_several_threads(model_files):
    paths, tensors = model_files
    loader = torch.classes.instanttensor.Loader(paths)  # every option has a default
    names = sorted(tensors)
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for i in range(60):
                name = names[(i + offset) % len(names)]
                assert same_bytes(loader.get_tensor(name), tensors[name])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    seen = 0
    while loader.next() is not None:
        seen += 1
    for t in threads:
        t.join()
    loader.close()
    assert not errors, errors
    assert seen == len(tensors)
