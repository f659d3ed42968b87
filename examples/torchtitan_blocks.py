"""fxremat the way torchtitan compiles: each transformer block separately, with the backend named in its config
(``[compile] enable = true, backend = "fxremat"``, or ``--compile.enable --compile.backend fxremat``).  torchtitan's
``apply_compile`` (torchtitan/distributed/compile.py) runs, for each block of ``model.layers``,
``block.compile(backend=compile_config.backend, fullgraph=True)``; this example does the same on a tiny model, so it
runs without torchtitan.  A memory budget comes from torchtitan's ``memory-budget`` activation checkpointing, which
sets ``torch._functorch.config.activation_memory_budget``: fxremat reads it (README, "PyTorch's knobs and tags").

    python examples/torchtitan_blocks.py     # two blocks, a few steps, eager and compiled; losses and the reports
"""

from __future__ import annotations

import torch

import fxremat


class Block(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


class TinyDecoder(torch.nn.Module):
    """torchtitan's shape: the blocks in ``self.layers`` (a ModuleDict), compiled one by one."""

    def __init__(self, blocks: int = 2, dim: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleDict({str(i): Block(dim) for i in range(blocks)})
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers.values():
            x = block(x)
        return self.head(x)


def compile_blocks(model: TinyDecoder, backend: str = "fxremat") -> None:
    """torchtitan's ``apply_compile``: each block compiled in place, whole-graph."""
    for _, block in model.layers.named_children():
        block.compile(backend=backend, fullgraph=True)


def train(backend: str | None = None, steps: int = 3) -> list[float]:
    """Losses of ``steps`` AdamW steps; ``backend``: what each block is compiled with (None: eager)."""
    model = TinyDecoder()
    if backend is not None:
        compile_blocks(model, backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 8, 16, generator=g), torch.randn(4, 8, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    print("eager   ", train())
    before = len(fxremat.string_backend_reports())
    with torch._functorch.config.patch(activation_memory_budget=0.5):  # what torchtitan's memory-budget AC sets
        print("fxremat ", train("fxremat"))
    for report in fxremat.string_backend_reports()[before:]:  # one per compiled block graph
        print(fxremat.format_text(report))


if __name__ == "__main__":
    main()
