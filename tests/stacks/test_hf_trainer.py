"""transformers' Trainer (examples/hf_trainer.py): the pattern that works, the one that needs an argument, the one
accelerate refuses."""

from __future__ import annotations

import hf_trainer
import pytest
import torch

import fxremat

pytestmark = pytest.mark.usefixtures("no_codegen")
STEPS = 3


@pytest.fixture(scope="module")
def eager_losses():
    return hf_trainer.train(hf_trainer.tiny_llama(), STEPS)


def test_compile_in_place_then_trainer(eager_losses):
    """``model.compile(backend=...)`` keeps the model's class and forward signature: the Trainer keeps its columns."""
    backend = fxremat.backend(memory_budget=0.5)
    model = hf_trainer.tiny_llama()
    model.compile(backend=backend)
    losses = hf_trainer.train(model, STEPS)
    torch.testing.assert_close(losses, eager_losses)
    assert backend.reports and all(r.memory_budget == 0.5 for r in backend.reports)


def test_compiled_wrapper_needs_remove_unused_columns(eager_losses):
    """``torch.compile(model)`` is PyTorch's ``OptimizedModule``, whose ``forward(*args, **kwargs)`` hides the
    model's signature: the Trainer drops every column unless told not to."""
    with pytest.raises(ValueError, match="batch received was empty"):
        hf_trainer.train(torch.compile(hf_trainer.tiny_llama(), backend="fxremat"), STEPS)
    before = len(fxremat.string_backend_reports())
    compiled = torch.compile(hf_trainer.tiny_llama(), backend="fxremat")
    losses = hf_trainer.train(compiled, STEPS, remove_unused_columns=False)
    torch.testing.assert_close(losses, eager_losses)
    assert len(fxremat.string_backend_reports()) > before


def test_torch_compile_backend_argument_is_refused_by_accelerate():
    """The Trainer hands ``torch_compile_backend`` to accelerate, whose ``DynamoBackend`` enum lists its own backend
    names only (docs/STACKS.md).  Should this start to pass through, README's "Training stacks" needs updating."""
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        hf_trainer.train(hf_trainer.tiny_llama(), STEPS, torch_compile=True, torch_compile_backend="fxremat")
