"""accelerate's Accelerator (examples/accelerate_loop.py): compile first, then ``prepare``."""

from __future__ import annotations

import accelerate_loop
import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import TorchDynamoPlugin

import fxremat

pytestmark = pytest.mark.usefixtures("no_codegen")


def test_compiled_model_through_prepare():
    backend = fxremat.backend(memory_budget=0.5)
    losses = accelerate_loop.train(backend)
    torch.testing.assert_close(losses, accelerate_loop.train())
    assert len(backend.reports) == 1 and backend.reports[0].memory_budget == 0.5


def test_prepare_keeps_the_compiled_model():
    """``prepare`` returns the model compiled with fxremat, not one it compiled again with its own plugin."""
    compiled = torch.compile(accelerate_loop.tiny_mlp(), backend="fxremat")
    prepared = Accelerator(cpu=True).prepare(compiled)
    assert prepared is compiled


@pytest.mark.parametrize(
    "make",
    [lambda: Accelerator(cpu=True, dynamo_backend="fxremat"), lambda: TorchDynamoPlugin(backend="fxremat")],
    ids=["Accelerator", "TorchDynamoPlugin"],
)
def test_dynamo_backend_names_are_accelerates_own(make):
    """accelerate checks a backend name against its ``DynamoBackend`` enum (docs/STACKS.md): no custom backend.
    Should this start to pass, README's "Training stacks" needs updating."""
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        make()
