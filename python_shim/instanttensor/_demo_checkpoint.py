"""A synthetic, model-like checkpoint: a few large embeddings, many matrices, many small norms."""

from __future__ import annotations

import os

import torch

from ._files import save_file


def write_model_like_checkpoint(folder: str, total_mb: int = 256, files: int = 2,
                                seed: int = 0, hidden: int = 1024, vocab: int = 8192) -> list[str]:
    """Writes about `total_mb` MB of bf16 and fp32 tensors into `files` shards in `folder`.

    Layout like an LLM's: embedding and head (bf16), per layer 4 attention and 3 MLP matrices
    (bf16), 2 norm weights and a bias (fp32). Returns the shard paths. Deterministic for a seed.
    """
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    inner = hidden * 11 // 4
    per_layer = (4 * hidden * hidden + 3 * hidden * inner) * 2 + 3 * hidden * 4
    embed_bytes = 2 * vocab * hidden * 2
    layers = max(1, (total_mb * 2**20 - embed_bytes) // per_layer)

    def rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype).normal_(generator=generator)

    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(files)]
    shards[0]["model.embed_tokens.weight"] = rand(vocab, hidden, dtype=torch.bfloat16)
    for layer in range(layers):
        shard = shards[min(files - 1, layer * files // layers)]
        p = f"model.layers.{layer}."
        for proj in ("q", "k", "v", "o"):
            shard[p + f"self_attn.{proj}_proj.weight"] = rand(hidden, hidden, dtype=torch.bfloat16)
        shard[p + "mlp.gate_proj.weight"] = rand(inner, hidden, dtype=torch.bfloat16)
        shard[p + "mlp.up_proj.weight"] = rand(inner, hidden, dtype=torch.bfloat16)
        shard[p + "mlp.down_proj.weight"] = rand(hidden, inner, dtype=torch.bfloat16)
        shard[p + "input_layernorm.weight"] = rand(hidden, dtype=torch.float32)
        shard[p + "post_attention_layernorm.weight"] = rand(hidden, dtype=torch.float32)
        shard[p + "self_attn.o_proj.bias"] = rand(hidden, dtype=torch.float32)
    shards[-1]["lm_head.weight"] = rand(vocab, hidden, dtype=torch.bfloat16)
    shards[-1]["model.norm.weight"] = rand(hidden, dtype=torch.float32)
    paths = []
    for index, shard in enumerate(shards):
        path = os.path.join(folder, f"model-{index + 1:05d}-of-{files:05d}.safetensors")
        save_file(shard, path, metadata={"format": "pt"})
        paths.append(path)
    return paths
