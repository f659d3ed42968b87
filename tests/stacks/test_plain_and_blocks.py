"""The plain loop (examples/plain_loop.py) and per-block compile as torchtitan applies it
(examples/torchtitan_blocks.py: torchtitan itself is not installed by the test extra, docs/STACKS.md says why)."""

from __future__ import annotations

import plain_loop
import pytest
import torch
import torchtitan_blocks

import fxremat

pytestmark = pytest.mark.usefixtures("no_codegen")


def test_plain_loop():
    backend = fxremat.backend(memory_budget=0.5)
    torch.testing.assert_close(plain_loop.train(backend), plain_loop.train())
    assert len(backend.reports) == 1 and backend.reports[0].memory_budget == 0.5


def test_each_block_compiled_separately():
    """torchtitan's ``apply_compile``: every block of ``model.layers`` compiled in place, the rest eager."""
    model = torchtitan_blocks.TinyDecoder(blocks=3)
    torchtitan_blocks.compile_blocks(model)
    assert all(block._compiled_call_impl is not None for block in model.layers.values())
    assert model._compiled_call_impl is None and model.head._compiled_call_impl is None


def test_per_block_losses_and_torchtitan_memory_budget():
    """The losses equal eager's, one report per block graph, and the budget torchtitan's ``memory-budget``
    activation checkpointing sets (PyTorch's ``activation_memory_budget``) reaches every graph."""
    before = len(fxremat.string_backend_reports())
    with torch._functorch.config.patch(activation_memory_budget=0.5):
        losses = torchtitan_blocks.train("fxremat")
    torch.testing.assert_close(losses, torchtitan_blocks.train())
    new = fxremat.string_backend_reports()[before:]
    assert len(new) >= 1
    assert all((r.memory_budget, r.memory_budget_source) == (0.5, "torch._functorch.config") for r in new)
