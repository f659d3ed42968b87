"""tests/stacks: fxremat inside the training stacks (transformers' Trainer, accelerate, Lightning, torchtitan's
per-block compile, the plain loop), each through the runnable example of examples/ that documents it.

Most tests are about the stack's plumbing (does the stack hand fxremat's backend the graphs, with the options, and
can the user reach the reports afterwards), so they run under ``no_codegen``: the real backend, options,
partitioner and reports, with Inductor's code generation left out (``fxremat_passes._torch_private.no_codegen``;
a C++ compile takes minutes here).  Those marked ``inductor`` compile for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers import torch_seed  # noqa: F401  (a fixture: pytest registers those a conftest holds)

from fxremat_passes._torch_private.no_codegen import inductor_without_codegen

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the examples are scripts, not a package: the tests import them by name (``import lightning_fit``)
sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(autouse=True)
def torch_compile_as_found():
    """Importing Lightning replaces ``torch.compile`` for the rest of the process (lightning/fabric/wrappers.py
    wraps it to keep a deep copy of the compile arguments).  A test that imports Lightning must not leave the rest
    of the suite running under that wrapper: the ``torch.compile`` found is put back after each test."""
    found = torch.compile
    yield
    torch.compile = found


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after: the examples' models share code objects across tests, and a graph
    compiled under ``no_codegen`` must never serve a test that compiles for real (or the reverse)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_codegen(fresh_dynamo):
    with inductor_without_codegen():
        yield
