"""The staged transfer path: forced on the CPU here, on CUDA when a GPU is present."""

from __future__ import annotations

import pytest
import torch

import instanttensor
from conftest import same_bytes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("copy", [True, False])
def test_forced_staging_on_cpu_matches(model_files, copy):
    paths, tensors = model_files
    largest = max(t.nbytes for t in tensors.values())
    total = sum(t.nbytes for t in tensors.values())
    staging = 32 << 10  # the smallest staging ring: large tensors stream through it in slices
    assert total > 2 * staging
    with instanttensor.safe_open(paths, copy=copy, staging_size=staging,
                                 buffer_size=None if copy else largest + 8192,
                                 _force_staging=True) as f:
        kept = list(f.tensors())  # kept on purpose: both rings wrap under it
        if not copy:
            assert f.stats()["materializations"] > 0
    for name, tensor in kept:
        assert same_bytes(tensor, tensors[name]), name


@cuda
@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("device", ["cuda", 0, "cuda:0"])
def test_cuda_parity_with_safetensors(model_files, copy, device):
    from safetensors import safe_open as reference_open

    paths, tensors = model_files
    current = torch.cuda.current_device()
    with instanttensor.safe_open(paths, device=device, copy=copy) as f:
        for name, tensor in f.tensors():
            # An unindexed "cuda" resolves to the current device: a concrete index, always.
            assert tensor.device == torch.device("cuda", current), name
            assert same_bytes(tensor, tensors[name]), name
            target = torch.empty_like(tensor, device=torch.device("cuda", current))
            target.copy_(tensor)  # what a weight loader does with it
            assert same_bytes(target, tensors[name]), name
    with reference_open(paths[0], framework="pt", device="cuda") as ref:
        for name in ref.keys():
            with instanttensor.safe_open(paths[0], device="cuda") as f:
                assert same_bytes(f.get_tensor(name), ref.get_tensor(name))


@cuda
def test_borrowed_views_consumed_on_a_side_stream(model_files):
    paths, tensors = model_files
    side = torch.cuda.Stream()
    outputs = {}
    with torch.cuda.stream(side):  # the consumer's current stream: events order reuse on it
        with instanttensor.safe_open(paths, device="cuda", copy=False,
                                     buffer_size=64 << 10) as f:
            for name, tensor in f.tensors():
                assert tensor.device == torch.device("cuda", torch.cuda.current_device())
                # A slow consumer (~10^7 cycles, milliseconds): reuse must wait for it.
                torch.cuda._sleep(10_000_000)
                outputs[name] = tensor.float() * 1.0
    side.synchronize()
    for name, value in outputs.items():
        assert torch.equal(value.cpu(), tensors[name].float()), name


@cuda
def test_budget_error_and_host_fallback(model_files):
    paths, tensors = model_files
    with pytest.raises(ValueError, match="budget"):
        instanttensor.safe_open(paths, device="cuda", max_free_mem_usage=1e-12)
    with instanttensor.safe_open(paths, device="cuda", max_free_mem_usage=1e-12,
                                 host_fallback=True) as f:
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name])


@cuda
def test_device_memory_returns_after_close(model_files):
    paths, _ = model_files
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for copy in (True, False):
        with instanttensor.safe_open(paths, device="cuda", copy=copy) as f:
            for name, tensor in f.tensors():
                pass
        del tensor  # the loop's last tensor is the consumer's, not the loader's
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    # The pinned staging ring is given back at close, not kept in torch's host cache.
    assert torch.cuda.host_memory_stats()["allocated_bytes.current"] == 0


@cuda
def test_load_into_cuda_parameters_allocates_nothing_on_the_device(model_files):
    """Accelerator destinations: pinned staging -> the parameter's own bytes, on the loader's
    stream after work already queued on the consumer's; no device memory of the loader's."""
    paths, tensors = model_files
    device = torch.device("cuda", torch.cuda.current_device())
    destinations = {n: torch.zeros(t.shape, dtype=t.dtype, device=device)
                    for n, t in tensors.items()}
    destinations["embed.weight"] = torch.zeros(32, 64, dtype=torch.bfloat16, device=device).t()
    pointers = {n: t.data_ptr() for n, t in destinations.items()}
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    peak_before = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.cuda.stream(side):
        # Queued before the load on the consumer's stream: must read the old (zero) values.
        torch.cuda._sleep(10_000_000)
        old = destinations["lm_head.weight"].float().sum()
        instanttensor.load_into(destinations, paths, staging_size=32 << 10)
        new = destinations["lm_head.weight"].float().sum()
    side.synchronize()
    assert float(old) == 0.0
    assert float(new) == float(tensors["lm_head.weight"].float().sum())
    for name, tensor in destinations.items():
        assert tensor.data_ptr() == pointers[name], name
        assert same_bytes(tensor.cpu(), tensors[name]), name
    # Only the non-contiguous destination's stand-in and this test's float temporaries (~9 KB);
    # the checkpoint itself is ~70 KB.
    stand_in = tensors["embed.weight"].nbytes
    assert torch.cuda.max_memory_allocated() - before <= stand_in + (16 << 10), peak_before
    assert torch.cuda.host_memory_stats()["allocated_bytes.current"] == 0
