"""The AOTInductor packages of the tests: a small transformer block (attention and MLP), compiled
once per test run (about 15 s each on 2 cores) into a cache folder the run's modules share."""

from __future__ import annotations

import hashlib
import os
import tempfile

import torch
import torch.nn.functional as F

DIM, HEADS, HIDDEN = 32, 2, 64
EXAMPLE_SHAPE = (2, 5, DIM)


class Block(torch.nn.Module):
    """Pre-norm attention then MLP. Every 1-D parameter has more than 8 elements: inductor
    inlines smaller ones into the code, so they would be no constant of the package."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.mlp_in = torch.nn.Linear(DIM, HIDDEN)
        self.mlp_out = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, DIM))
        return x + self.mlp_out(F.gelu(self.mlp_in(x)))


def block(seed: int) -> Block:
    """A block whose weights follow `seed` (every parameter random, biases and norms too)."""
    torch.manual_seed(seed)
    model = Block().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)
    return model


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().contiguous() for name, t in model.state_dict().items()}


def packages() -> tuple[str, str]:
    """(constants-free package, package with its constants inside, torch's default), compiled
    from block(0) once per cache key (torch's version and this file's text)."""
    with open(__file__, "rb") as source:
        key = hashlib.sha256(source.read() + torch.__version__.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"instanttensor-aoti-{key}")
    os.makedirs(folder, exist_ok=True)
    paths = (os.path.join(folder, "free.pt2"), os.path.join(folder, "inside.pt2"))
    model = block(0)
    example = (torch.randn(*EXAMPLE_SHAPE),)
    for path, inside in zip(paths, (False, True)):
        if os.path.exists(path):
            continue
        exported = torch.export.export(model, example)
        partial = path + f".{os.getpid()}.pt2"
        torch._inductor.aoti_compile_and_package(
            exported, package_path=partial,
            inductor_configs={"aot_inductor.package_constants_in_so": inside})
        os.replace(partial, path)  # a run that stops midway never leaves half a package
    return paths


class Folded(torch.nn.Module):
    """Weights the package transforms once (runtime constant folding): the transformed tensors
    are constants the package computes, from no checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 32))
        self.b = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.w.t() * 2 + 1) + self.b.exp()


def folding_package() -> str:
    """A constants-free package of Folded compiled with aot_inductor.use_runtime_constant_folding,
    cached as packages() are."""
    free, _ = packages()
    path = os.path.join(os.path.dirname(free), "folding.pt2")
    if not os.path.exists(path):
        torch.manual_seed(0)
        exported = torch.export.export(Folded().eval(), (torch.randn(4, 32),))
        partial = path[:-4] + f".{os.getpid()}.pt2"
        torch._inductor.aoti_compile_and_package(
            exported, package_path=partial,
            inductor_configs={"aot_inductor.package_constants_in_so": False,
                              "aot_inductor.use_runtime_constant_folding": True})
        os.replace(partial, path)
    return path
