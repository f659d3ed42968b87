"""Lightning (examples/lightning_fit.py): ``torch.compile`` of the LightningModule, both forms, then ``fit``; and
Fabric, which compiles again with its deep copy of the compile arguments.

Lightning is imported by the ``lit`` fixture, not at collection: its import wraps ``torch.compile`` for the rest of
the process, and the rest of the suite must not run under that wrapper (tests/stacks/conftest.py puts the real one
back after each test)."""

from __future__ import annotations

import importlib

import pytest
import torch

import fxremat

STEPS = 3


@pytest.fixture
def lit():
    """examples/lightning_fit.py, with ``torch.compile`` wrapped by Lightning as in a user's process that imported
    it (the wrapper is Lightning's ``_capture_compile_kwargs``; re-applied where an earlier test's import made it)."""
    example = importlib.import_module("lightning_fit")
    if getattr(torch.compile, "__wrapped__", None) is None:
        from lightning.fabric.wrappers import _capture_compile_kwargs

        torch.compile = _capture_compile_kwargs(torch.compile)
    return example


def test_backend_object(no_codegen, lit):
    """The ``torch.compile`` line keeps a deep copy of the backend (it raised before backends could be copied);
    ``fit`` compiles with the object passed, and its reports fill."""
    backend = fxremat.backend(memory_budget=0.5)
    compiled = torch.compile(lit.TinyRegression(), backend=backend)
    assert compiled._compile_kwargs["backend"] is not backend  # Lightning's deep copy
    losses = lit.fit(compiled, STEPS)
    torch.testing.assert_close(losses, lit.fit(lit.TinyRegression(), STEPS))
    assert backend.reports and all(r.memory_budget == 0.5 for r in backend.reports)


def test_string_with_options(no_codegen, lit):
    before = len(fxremat.string_backend_reports())
    module = torch.compile(lit.TinyRegression(), backend="fxremat", options={"memory_budget": 0.5})
    losses = lit.fit(module, STEPS)
    torch.testing.assert_close(losses, lit.fit(lit.TinyRegression(), STEPS))
    new = fxremat.string_backend_reports()[before:]
    assert new and all(r.memory_budget == 0.5 for r in new)


def test_fabric_compiles_with_the_deep_copy(no_codegen, lit):
    """Fabric's ``setup`` compiles the module again with the deep copy of the compile arguments it kept
    (``_compile_kwargs``): that copy's reports reach the backend object the user passed."""
    from lightning import Fabric

    backend = fxremat.backend(memory_budget=0.5)
    model = Fabric(accelerator="cpu", devices=1).setup(torch.compile(lit.TinyRegression().net, backend=backend))
    x, y = next(iter(lit.data()))
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.testing.assert_close(loss, torch.nn.functional.mse_loss(lit.TinyRegression().net(x), y))
    assert len(backend.reports) == 1 and backend.reports[0].memory_budget == 0.5


@pytest.mark.inductor
def test_backend_object_under_inductor(fresh_dynamo, lit):
    """The same as test_backend_object through real Inductor, whose cache key pickles the partitioner the backend
    hands it."""
    backend = fxremat.backend(memory_budget=0.5)
    losses = lit.fit(torch.compile(lit.TinyRegression(), backend=backend), STEPS)
    torch.testing.assert_close(losses, lit.fit(lit.TinyRegression(), STEPS))
    assert backend.reports and all(r.memory_budget == 0.5 and r.fallback_reason is None for r in backend.reports)
