"""Models for the vLLM engine tests and benchmark, written by `transformers.save_pretrained`:
random weights, bf16, several safetensors shards with their index file, as a hub checkpoint.

`python vllm_engine_models.py KIND DIRECTORY [SIZE]` writes one (KIND: dense, moe; SIZE: tiny,
1gb for dense). Heads are 64 wide: vLLM's CPU attention has no kernel for 16.
"""

from __future__ import annotations

import sys


def _save(model, directory: str, shard_size: str) -> None:
    import torch

    model.to(torch.bfloat16).save_pretrained(directory, max_shard_size=shard_size)


def write_dense(directory: str, size: str = "tiny") -> None:
    """A Llama-like model: tiny (2.6 MB in 12 shards) or 1gb (1.07 GB in 5 shards)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if size == "tiny":
        config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128)
        shard = "200KB"
    elif size == "1gb":
        config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                             num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4,
                             max_position_embeddings=128, tie_word_embeddings=False)
        shard = "250MB"
    else:
        raise ValueError(f"unknown size {size!r}: tiny or 1gb")
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    _save(model, directory, shard)


def write_moe(directory: str) -> None:
    """A Mixtral-like model: 4 experts, 2 per token, 2 layers, 4.2 MB in 11 shards."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=256, hidden_size=256, intermediate_size=256,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=128, num_local_experts=4,
                           num_experts_per_tok=2)
    _save(MixtralForCausalLM(config), directory, "300KB")


if __name__ == "__main__":
    kind, directory = sys.argv[1], sys.argv[2]
    if kind == "dense":
        write_dense(directory, *(sys.argv[3:4] or ["tiny"]))
    elif kind == "moe":
        write_moe(directory)
    else:
        raise SystemExit(f"unknown kind {kind!r}: dense or moe")
