"""The callers' own released loader functions on our package: vLLM 0.33.0's and SGLang 0.5.23's
`instanttensor_weights_iterator`, imported from their wheels (installed without their
dependencies by scripts/test_callers.sh, each in an environment of its own), single process and
two gloo ranks, every tensor byte-equal to the reference reader.

Only what asks for CUDA is patched: their platform object (the CUDA check and the current
device, here the CPU) and, for SGLang, `torch.cuda.current_device`. The two-rank runs hand the
group in the shape each caller reads (vLLM: `get_world_group()` with `device_group` and
`world_size`; SGLang: its `load_group` argument). Without the caller installed these tests skip,
unless INSTANTTENSOR_REQUIRE_CALLERS names it (scripts/test_callers.sh sets it), where a failed
import fails.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import simulated_device

CALLERS = {"vllm": "vllm.model_executor.model_loader.weight_utils",
           "sglang": "sglang.srt.model_loader.weight_utils"}


def caller(name: str):
    """The caller's weight_utils module, or a skip (a failure where it is required)."""
    required = name in os.environ.get("INSTANTTENSOR_REQUIRE_CALLERS", "").split(",")
    try:
        return importlib.import_module(CALLERS[name])
    except Exception as error:  # noqa: BLE001 - any import failure means "not usable here"
        if required:
            raise
        pytest.skip(f"{name} is not installed here ({type(error).__name__}: {error}); "
                    "scripts/test_callers.sh runs these tests")


def digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def moe_checkpoint(tmp_path):
    """A small MoE model in two shards, names as vLLM's expert filter parses them."""
    torch.manual_seed(11)
    tensors = {"model.embed_tokens.weight": torch.randn(64, 32).to(torch.bfloat16),
               "lm_head.weight": torch.randn(64, 32).to(torch.bfloat16)}
    for layer in range(2):
        tensors[f"model.layers.{layer}.self_attn.qkv_proj.weight"] = torch.randn(96, 32)
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = torch.randn(32)
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = torch.randn(4, 32)
        for expert in range(4):
            tensors[f"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"] = \
                torch.randn(16, 32).to(torch.float16)
            tensors[f"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"] = \
                torch.randn(32, 16).to(torch.float16)
    names = sorted(tensors)
    paths = []
    for index in range(2):
        path = str(tmp_path / f"model-0000{index + 1}-of-00002.safetensors")
        reference_save({n: tensors[n] for n in names[index::2]}, path, metadata={"format": "pt"})
        paths.append(path)
    reference = {}
    for path in paths:
        reference.update({n: digest(t) for n, t in reference_load(path).items()})
    return paths, reference


class CpuPlatform:
    """Their platform object, as CUDA would answer, on the CPU."""

    device_type = "cuda"
    index = 0  # what torch.cuda.current_device() answers

    @staticmethod
    def is_cuda() -> bool:
        return True

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def get_device(index) -> torch.device:
        return torch.device("cpu")


class SimulatedDevicePlatform(CpuPlatform):
    """Their platform object, as CUDA would answer, on the simulated device `index`."""

    def __init__(self, index: int):
        self.index = index

    def current_device(self) -> torch.device:
        return torch.device("simdev", self.index)

    def get_device(self, index) -> torch.device:
        return torch.device("simdev", index)


def test_vllm_loads_every_tensor(moe_checkpoint, monkeypatch):
    weight_utils = caller("vllm")
    monkeypatch.setattr(weight_utils, "current_platform", CpuPlatform())
    paths, reference = moe_checkpoint
    loaded = {n: digest(t) for n, t in weight_utils.instanttensor_weights_iterator(paths, True)}
    assert loaded == reference


def test_vllm_expert_filtering_reads_only_local_experts(moe_checkpoint, monkeypatch):
    weight_utils = caller("vllm")
    monkeypatch.setattr(weight_utils, "current_platform", CpuPlatform())
    paths, reference = moe_checkpoint
    local = {1, 3}
    loaded = {n: digest(t) for n, t in
              weight_utils.instanttensor_weights_iterator(paths, False, local_expert_ids=local)}
    expected = {n: d for n, d in reference.items()
                if ".experts." not in n or int(n.split(".experts.")[1].split(".")[0]) in local}
    assert loaded == expected
    # An expert set that selects no expert of this model still loads the dense weights.
    loaded = dict(weight_utils.instanttensor_weights_iterator(paths, False,
                                                              local_expert_ids={99}))
    assert set(loaded) == {n for n in reference if ".experts." not in n}


@pytest.mark.parametrize("backend", ["BUFFERED", ["URING", "AIO"], ["CUFILE", "MMAP"], None])
def test_sglang_loads_every_tensor_with_its_backend_names(moe_checkpoint, monkeypatch, backend):
    weight_utils = caller("sglang")
    monkeypatch.setattr(weight_utils, "current_platform", CpuPlatform())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    paths, reference = moe_checkpoint
    extra = {"buffer_size": 1 << 20} if backend is None else {"backend": backend}
    loaded = {n: digest(t) for n, t in
              weight_utils.instanttensor_weights_iterator(paths, extra_config=extra)}
    assert loaded == reference


def test_sglang_refuses_unknown_backend_names_through_our_enums(moe_checkpoint, monkeypatch):
    weight_utils = caller("sglang")
    monkeypatch.setattr(weight_utils, "current_platform", CpuPlatform())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ValueError, match="AIO_BUFFERED"):  # its message lists our members
        next(weight_utils.instanttensor_weights_iterator(moe_checkpoint[0],
                                                         extra_config={"backend": "FLOPPY"}))


RANK_SCRIPT = textwrap.dedent("""
    import hashlib, json, sys, types
    import torch
    import torch.distributed as dist

    rank, caller, spec = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    sys.path.insert(0, spec["tests"])
    from test_callers import CpuPlatform, SimulatedDevicePlatform, digest
    platform, backend = CpuPlatform(), "gloo"
    if spec.get("device") == "simdev":
        # A GPU machine's shape: each rank on its own device, vLLM's device group
        # ("cpu:gloo,cuda:nccl") as "cpu:gloo,simdev:simccl".
        import os
        os.environ["INSTANTTENSOR_CMAKE_BUILD_DIR"] = spec["build_dir"]
        import simulated_device
        assert simulated_device.register_collectives()
        platform = SimulatedDevicePlatform(rank % 2)
        backend = simulated_device.DEVICE_GROUP
    dist.init_process_group(backend, init_method="file://" + spec["store"], rank=rank,
                            world_size=2)

    group = types.SimpleNamespace(device_group=dist.group.WORLD, world_size=2)
    if caller == "vllm":
        from vllm.model_executor.model_loader import weight_utils
        weight_utils.current_platform = platform
        weight_utils.get_world_group = lambda: group  # vLLM's world GroupCoordinator shape
        local = spec["local_expert_ids"][rank] if spec.get("local_expert_ids") else None
        items = weight_utils.instanttensor_weights_iterator(
            spec["files"], rank == 0, local_expert_ids=None if local is None else set(local))
    else:
        from sglang.srt.model_loader import weight_utils
        weight_utils.current_platform = platform
        torch.cuda.current_device = lambda: platform.index
        items = weight_utils.instanttensor_weights_iterator(
            spec["files"], extra_config=spec.get("extra_config"), load_group=group)
    result = {"digests": {}, "devices": set()}
    for name, tensor in items:
        result["digests"][name] = digest(tensor)
        result["devices"].add(str(tensor.device))
    result["devices"] = sorted(result["devices"])
    with open(spec["out"] % rank, "w") as out:
        json.dump(result, out)
    dist.destroy_process_group()
""")


def run_two_ranks(tmp_path, name, **spec):
    script = tmp_path / "caller_rank.py"
    script.write_text(RANK_SCRIPT)
    spec.update(store=str(tmp_path / "store"), out=str(tmp_path / "rank%d.json"),
                tests=os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, INSTANTTENSOR_DEBUG="1")  # each load's line says how it exchanged
    if spec.get("device") == "simdev":
        if not simulated_device.register_collectives():
            pytest.skip("needs the CMake build's simulated device (INSTANTTENSOR_CMAKE_BUILD_DIR)")
        spec["build_dir"] = simulated_device.build_dir()
        env["INSTANTTENSOR_SIMDEV_DELAY"] = simulated_device.DELAYS_AT_IMPORT or "0"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), name, json.dumps(spec)],
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a rank hung")
        errors.append(err)
    results = []
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, errors[rank][-3000:]
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        result["exchanges"] = re.findall(r", exchange: (.*)$", errors[rank], re.MULTILINE)
        results.append(result)
    return results


def test_vllm_two_ranks_exchange_over_the_world_device_group(moe_checkpoint, tmp_path):
    caller("vllm")
    paths, reference = moe_checkpoint
    for result in run_two_ranks(tmp_path, "vllm", files=paths):
        assert result["digests"] == reference


def test_vllm_two_ranks_with_expert_filtering_load_their_own_experts(moe_checkpoint, tmp_path):
    caller("vllm")
    paths, reference = moe_checkpoint
    local = [[0, 1], [2, 3]]
    results = run_two_ranks(tmp_path, "vllm", files=paths, local_expert_ids=local)
    for rank, result in enumerate(results):
        expected = {n: d for n, d in reference.items() if ".experts." not in n
                    or int(n.split(".experts.")[1].split(".")[0]) in local[rank]}
        assert result["digests"] == expected


def test_vllm_two_ranks_exchange_on_the_device_over_a_device_group(moe_checkpoint, tmp_path):
    caller("vllm")
    paths, reference = moe_checkpoint
    for rank, result in enumerate(run_two_ranks(tmp_path, "vllm", files=paths, device="simdev")):
        assert result["digests"] == reference
        assert result["devices"] == [f"simdev:{rank}"]
        assert result["exchanges"] == ["device (device target)"], result["exchanges"]


def test_sglang_two_ranks_exchange_on_the_device_over_a_device_group(moe_checkpoint, tmp_path):
    caller("sglang")
    paths, reference = moe_checkpoint
    for rank, result in enumerate(run_two_ranks(tmp_path, "sglang", files=paths,
                                                device="simdev")):
        assert result["digests"] == reference
        assert result["devices"] == [f"simdev:{rank}"]
        assert result["exchanges"] == ["device (device target)"], result["exchanges"]


@pytest.mark.parametrize("extra_config", [None, {"backend": "BUFFERED"}])
def test_sglang_two_ranks_exchange_over_its_load_group(moe_checkpoint, tmp_path, extra_config):
    caller("sglang")
    paths, reference = moe_checkpoint
    for result in run_two_ranks(tmp_path, "sglang", files=paths, extra_config=extra_config):
        assert result["digests"] == reference
