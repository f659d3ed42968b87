"""fxremat with Lightning: ``torch.compile`` the LightningModule, then ``Trainer.fit`` it.  Both forms work: a
configured backend object (Lightning deep-copies it: the copy reports to the object you hold) and the string form
with ``options=``.

    python examples/lightning_fit.py         # a tiny MLP, a few steps, eager and compiled; losses and the report
"""

from __future__ import annotations

import lightning as L
import torch

import fxremat


class TinyRegression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LossLog(L.Callback):
    """The loss of each step, read outside the compiled ``training_step``."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
        self.losses.append(outputs["loss"].item())


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    rows = torch.utils.data.TensorDataset(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g))
    return torch.utils.data.DataLoader(rows, batch_size=8)


def fit(model: L.LightningModule, steps: int = 3) -> list[float]:
    """Losses of ``steps`` steps of ``Trainer.fit`` (``model``: a LightningModule, compiled or not)."""
    log = LossLog()
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=[log],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data())
    return log.losses


def main() -> None:
    print("eager   ", fit(TinyRegression()))
    backend = fxremat.backend(memory_budget=0.5)
    print("object  ", fit(torch.compile(TinyRegression(), backend=backend)))
    print("string  ", fit(torch.compile(TinyRegression(), backend="fxremat", options={"memory_budget": 0.5})))
    print(fxremat.format_text(backend.reports[0]))  # the string form's: fxremat.string_backend_reports()


if __name__ == "__main__":
    main()
