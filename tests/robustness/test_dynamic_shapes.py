"""Dynamic shapes through Dynamo + AOTAutograd with no-op compilers and fxremat's partitioner (strict): one compiled
graph, hence one partition, serves several sequence lengths with eager's gradients; SymInts cross from forward to
backward; budgets hold on symbolic graphs.  Both ways of asking for it: ``dynamic=True`` and ``mark_dynamic``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import aot_eager
from robust_helpers import FP32_RTOL, close_scaled

import fxremat
from fxremat.options import Options

LENGTHS = (5, 9, 13)


class ReshapeByLength(nn.Module):
    """Reshapes by the dynamic length (b * t rows, then heads), a mean over t, and a scale by 1/t: backward needs
    b and t as SymInts, not only tensors."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        h = self.fc1(x).reshape(b * t, self.heads, -1)  # rows depend on the dynamic length
        h = h.softmax(-1).reshape(b, t, self.heads, -1).transpose(1, 2)  # (b, heads, t, d)
        scores = (h @ h.transpose(-1, -2)) / t  # a SymInt as a divisor
        y = (scores @ h).transpose(1, 2).reshape(b, t, -1)
        y = F.gelu(self.fc2(self.norm(y[..., :d] + x)))
        return y.mean(1), y  # mean over t: its backward expands by t


def _compile(model, reports, dynamic, **options):
    partition_fn = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)
    backend = aot_eager(partition_fn)
    return torch.compile(model, backend=backend, dynamic=dynamic)


def _loss(out):
    pooled, full = out
    weight = torch.linspace(-1.0, 1.0, pooled.numel()).view(pooled.shape)
    return (pooled * weight).sum() + full.square().mean()


def _check_lengths(model, compiled, mark: bool):
    """A step per length, compiled and eager, compared: outputs, every parameter's and the input's gradient."""
    eager = copy.deepcopy(model)
    for length in LENGTHS:
        x = torch.randn(3, length, 8)
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        if mark:
            torch._dynamo.mark_dynamic(xs[0], 1)
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        out, expected_out = compiled(xs[0]), eager(xs[1])
        _loss(out).backward()
        _loss(expected_out).backward()
        errors = {
            f"output {k}": close_scaled(a.detach(), e.detach(), FP32_RTOL)
            for k, (a, e) in enumerate(zip(out, expected_out))
        }
        errors["input"] = close_scaled(xs[0].grad, xs[1].grad, FP32_RTOL)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            errors[name] = close_scaled(p.grad, q.grad, FP32_RTOL)
        bad = {k: v for k, v in errors.items() if v is not None}
        assert not bad, f"length {length}: {bad}"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("options", [{}, {"memory_budget": 0.5}], ids=str)
def test_dynamic_true_one_partition_for_every_length(options):
    torch.manual_seed(0)
    model, reports = ReshapeByLength(), []
    _check_lengths(model, _compile(model, reports, dynamic=True, **options), mark=False)
    assert len(reports) == 1, [r.graph_id for r in reports]  # no recompile, no new partition, per length
    report = reports[0]
    assert report.fallback_reason is None
    assert report.saved_symbols, "backward needs the dynamic sizes"
    assert any(any(ch.isalpha() for ch in row.nbytes_expr) for row in report.saved), "saved bytes are symbolic"
    if "memory_budget" in options:
        # The plan is chosen once, from the sizes seen at compile time; the order it rests on must be real.
        assert report.budget_met and report.saved_bytes <= report.budget_bytes < report.default_plan_saved_bytes


def test_mark_dynamic_one_partition_for_every_length():
    torch.manual_seed(0)
    model, reports = ReshapeByLength(), []
    _check_lengths(model, _compile(model, reports, dynamic=None, memory_budget=0.0), mark=True)
    assert len(reports) == 1, [r.graph_id for r in reports]
    assert reports[0].saved_symbols
