"""Test-only vLLM plugin (a `vllm.general_plugins` entry point, loaded by vLLM in every process it
starts, workers included) for the engine tests on vLLM's CPU build.

It changes two things and nothing else of vLLM:
- `instanttensor_weights_iterator` (vLLM's own, in weight_utils) refuses any platform but CUDA
  ("InstantTensor requires NVIDIA GPUs"). Its module's `current_platform` becomes a proxy whose
  `is_cuda()` answers True to that function's frame alone; every other caller and every other
  attribute reach the real CPU platform. The iterator then runs unchanged: its group
  (`get_world_group().device_group`, gloo here), its device (`current_platform.current_device()`,
  "cpu"), its copy=True.
- A load format of our own, "instanttensor_integration": DefaultModelLoader with its weight
  iterator replaced by `instanttensor.integrations.vllm.instanttensor_weights_iterator`, which
  reads INSTANTTENSOR_COPY (0: borrowed views of the loader's buffer). vLLM 0.32 has no borrowed
  mode of its own; `register_model_loader` is its public route for a loader.
"""

from __future__ import annotations

import sys
import time

INTEGRATION_FORMAT = "instanttensor_integration"


class _CudaCheckPasses:
    """The real platform, but `is_cuda()` is True when asked by `gate_code`'s frame."""

    def __init__(self, platform, gate_code):
        self._platform = platform
        self._gate_code = gate_code

    def is_cuda(self) -> bool:
        if sys._getframe(1).f_code is self._gate_code:
            return True
        return self._platform.is_cuda()

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _let_the_cuda_check_pass() -> None:
    from vllm.model_executor.model_loader import weight_utils

    platform = weight_utils.current_platform
    if isinstance(platform, _CudaCheckPasses):  # vLLM may load plugins more than once
        return
    gate = weight_utils.instanttensor_weights_iterator.__code__
    weight_utils.current_platform = _CudaCheckPasses(platform, gate)


def _register_integration_format() -> None:
    import dataclasses

    from vllm.distributed.parallel_state import get_world_group
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    class IntegrationLoader(DefaultModelLoader):
        """vLLM's default loader reading through instanttensor.integrations.vllm."""

        def __init__(self, load_config):
            super().__init__(load_config)
            # File discovery (_prepare_weights) knows only vLLM's formats: ours reads safetensors.
            self.load_config = dataclasses.replace(load_config, load_format="safetensors")

        def _get_weights_iterator(self, source):
            # Not applied, unlike vLLM's own: its unused-weight shard filter, its
            # mm-encoder-only filter and its expert-parallel `local_expert_ids` (none is set
            # for the dense and MoE models of the engine tests, which run without EP).
            _, files, _, _ = self._prepare_weights(
                source.model_or_path, source.subfolder, source.revision,
                source.fall_back_to_pt, source.allow_patterns_overrides)
            world = get_world_group()
            group = world.device_group if world.world_size > 1 else None
            use_tqdm = self.load_config.use_tqdm_on_load
            if self.counter_before_loading_weights == 0.0:
                # Before our import, which runs in the generator: vLLM's own iterator imports
                # inside its timed generator too, so "Loading weights took" counts it alike.
                self.counter_before_loading_weights = time.perf_counter()

            def weights():
                from instanttensor.integrations.vllm import instanttensor_weights_iterator

                for name, tensor in instanttensor_weights_iterator(files, use_tqdm,
                                                                   process_group=group):
                    yield source.prefix + name, tensor

            return weights()

    register_model_loader(INTEGRATION_FORMAT)(IntegrationLoader)


def register() -> None:
    """vLLM's plugin hook; idempotent, as vLLM asks of plugins."""
    _let_the_cuda_check_pass()
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    if INTEGRATION_FORMAT not in _LOAD_FORMAT_TO_MODEL_LOADER:
        _register_integration_format()
