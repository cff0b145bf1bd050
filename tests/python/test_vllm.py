"""The vLLM weight iterator and its INSTANTTENSOR_COPY contract; vLLM's exact call sequence."""

from __future__ import annotations

import gc

import pytest
import torch

import instanttensor
from conftest import same_bytes
from instanttensor.integrations.vllm import BORROWED_MARKER, instanttensor_weights_iterator


def test_default_and_copy_1_yield_owned_unmarked_tensors(model_files, monkeypatch):
    paths, tensors = model_files
    for value in (None, "1"):
        if value is None:
            monkeypatch.delenv("INSTANTTENSOR_COPY", raising=False)
        else:
            monkeypatch.setenv("INSTANTTENSOR_COPY", value)
        kept = dict(instanttensor_weights_iterator(paths, False))
        assert set(kept) == set(tensors)
        for name, tensor in kept.items():  # outlive the iterator
            assert not hasattr(tensor, BORROWED_MARKER)
            assert same_bytes(tensor, tensors[name])


def test_copy_0_yields_marked_borrowed_tensors(model_files, monkeypatch):
    paths, tensors = model_files
    monkeypatch.setenv("INSTANTTENSOR_COPY", "0")
    params = {name: torch.empty_like(t) for name, t in tensors.items()}
    for name, tensor in instanttensor_weights_iterator(paths, False):
        assert getattr(tensor, BORROWED_MARKER) is True
        params[name].copy_(tensor)  # a parameter loader consumes it synchronously
    for name, param in params.items():
        assert same_bytes(param, tensors[name])


def test_deferred_consumer_keeping_borrowed_tensors_still_gets_correct_values(model_files,
                                                                               monkeypatch):
    paths, tensors = model_files
    monkeypatch.setenv("INSTANTTENSOR_COPY", "0")
    monkeypatch.setenv("INSTANTTENSOR_BUFFER_SIZE", "12K")  # small: the buffer wraps
    kept = list(instanttensor_weights_iterator(paths, False))
    # More than twice the 12 KiB ring: the ring wrapped under the kept tensors.
    assert sum(t.nbytes for t in tensors.values()) > 2 * (12 << 10)
    assert len({t.data_ptr() for _, t in kept if t.numel()}) == len([t for _, t in kept if t.numel()])
    gc.collect()
    for name, tensor in kept:
        assert same_bytes(tensor, tensors[name]), name


@pytest.mark.parametrize("value", ["", "true", " 0", "2", "False", "0 "])
def test_other_copy_values_fail_before_opening_files(value, monkeypatch, tmp_path):
    monkeypatch.setenv("INSTANTTENSOR_COPY", value)
    missing = [str(tmp_path / "never-opened.safetensors")]
    with pytest.raises(ValueError) as info:
        next(instanttensor_weights_iterator(missing, False))
    message = str(info.value)
    assert "INSTANTTENSOR_COPY" in message and repr(value) in message and "'0' or '1'" in message


def test_tqdm_progress_in_bytes(model_files, monkeypatch):
    paths, tensors = model_files
    updates = []
    import tqdm.auto

    class RecordingBar:
        def __init__(self, total=None, **kwargs):
            updates.append(("total", total))

        def update(self, n):
            updates.append(("update", n))

        def close(self):
            updates.append(("close", None))

    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    list(instanttensor_weights_iterator(paths, True))
    assert updates[0] == ("total", sum(t.nbytes for t in tensors.values()))
    assert sum(n for kind, n in updates if kind == "update") == updates[0][1]
    assert updates[-1] == ("close", None)


def test_key_selection_for_draft_models(model_files):
    paths, tensors = model_files
    got = dict(instanttensor_weights_iterator(paths, False, keys=["lm_head.weight"]))
    assert list(got) == ["lm_head.weight"]
    assert same_bytes(got["lm_head.weight"], tensors["lm_head.weight"])


def test_vllm_builtin_call_sequence(model_files):
    """What vLLM's own `--load-format instanttensor` iterator does with the package."""
    paths, tensors = model_files
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    seen = 0
    with instanttensor.safe_open(paths, framework="pt", device=device, process_group=None,
                                 copy=True) as f:
        total = f.total_tensor_size
        for name, tensor in f.tensors():
            assert same_bytes(tensor, tensors[name])
            seen += tensor.nbytes
    assert seen == total
