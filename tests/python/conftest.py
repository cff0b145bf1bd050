"""Shared helpers for the Python tests."""

from __future__ import annotations

import os

import pytest
import torch


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical dtype, shape and raw bytes (NaN-safe, works for float8/float4/uint types)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a = a.detach().cpu().contiguous()
    b = b.detach().cpu().contiguous()
    if a.numel() == 0:
        return True
    return bytes(a.view(-1).view(torch.uint8).numpy()) == bytes(b.view(-1).view(torch.uint8).numpy())


@pytest.fixture
def model_files(tmp_path) -> tuple[list[str], dict[str, torch.Tensor]]:
    """A small two-file model written by the reference safetensors package."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    first = {"embed.weight": torch.randn(64, 32).to(torch.bfloat16)}
    second = {"lm_head.weight": torch.randn(64, 32).to(torch.bfloat16)}
    for i in range(8):
        target = first if i < 4 else second
        target[f"layers.{i}.attn.weight"] = torch.randn(32, 32)
        target[f"layers.{i}.mlp.weight"] = torch.randn(48, 32).to(torch.float16)
        target[f"layers.{i}.norm.weight"] = torch.randn(32)
    paths = [str(tmp_path / "model-00001-of-00002.safetensors"),
             str(tmp_path / "model-00002-of-00002.safetensors")]
    save_file(first, paths[0], metadata={"format": "pt"})
    save_file(second, paths[1], metadata={"format": "pt"})
    return paths, {**first, **second}


@pytest.fixture(autouse=True)
def _clean_instanttensor_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("INSTANTTENSOR_"):
            monkeypatch.delenv(name)


def pytest_report_header(config):
    # The suites arm faults and set INSTANTTENSOR_TESTING_* variables: they need a build with the
    # testing hooks (scripts/test.sh installs one), which this line shows as "testing-hooks".
    import instanttensor  # noqa: F401  (loads the library)

    return f"instanttensor build: {torch.ops.instanttensor.build_info()}"
