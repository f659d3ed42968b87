"""fxremat in a hand-written training loop: a configured backend, its reports on the object you hold.

    python examples/plain_loop.py            # a few steps of a tiny MLP, eager and compiled; losses and the report
"""

from __future__ import annotations

import torch

import fxremat


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(steps)]


def train(backend=None, steps: int = 3) -> list[float]:
    """Losses of ``steps`` SGD steps; ``backend``: what ``torch.compile`` gets (None: eager)."""
    model = tiny_mlp()
    step_model = model if backend is None else torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches(steps):
        loss = torch.nn.functional.mse_loss(step_model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    backend = fxremat.backend(memory_budget=0.5)
    print("eager   ", train())
    print("fxremat ", train(backend))
    print(fxremat.format_text(backend.reports[0]))


if __name__ == "__main__":
    main()
