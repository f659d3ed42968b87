"""fxremat with accelerate's ``Accelerator``: compile the model yourself, then ``accelerator.prepare`` it (it does
not compile a compiled model again).  ``Accelerator(dynamo_backend=...)`` and ``TorchDynamoPlugin(backend=...)``
accept only accelerate's own list of backend names (docs/STACKS.md).

    python examples/accelerate_loop.py       # a tiny MLP, a few steps, eager and compiled; losses and the report
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

import fxremat


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    rows = torch.utils.data.TensorDataset(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g))
    return torch.utils.data.DataLoader(rows, batch_size=8)


def train(backend=None, steps: int = 3) -> list[float]:
    """Losses of ``steps`` steps through an ``Accelerator``; ``backend``: what ``torch.compile`` gets (None: eager)."""
    accelerator = Accelerator(cpu=True)
    model = tiny_mlp()
    if backend is not None:
        model = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, data())
    losses = []
    for (x, y), _ in zip(loader, range(steps)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
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
