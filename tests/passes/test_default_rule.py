"""The no-budget default recomputes no matmul-class kernel (docs/DESIGN.md §4.5); a budget may, and a user's
recompute tag wins (``test_partition_aot.test_must_recompute_is_never_saved_even_when_memory_is_free``).  Through
AOTAutograd with no-op compilers, gradients checked against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import assert_grads_close, eager_grads, run_fxremat_aot

from fxremat_passes.graph.ops import is_compute_bound_name

# Memory priced this high, the cost model alone would recompute the Linears: what the rule must stop.
DEAR_MEMORY = 1000.0


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 256), nn.Linear(256, 256), nn.Linear(256, 32)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _matmuls(report) -> list[str]:
    return [r.name for r in report.recomputed if is_compute_bound_name(r.op)]


@pytest.mark.parametrize("settings", [dict(), dict(memory_budget=1.0), dict(solver="milp")], ids=str)
def test_the_default_recomputes_no_matmul_and_gradients_equal_eager(settings):
    model, inputs = Mlp(), (torch.randn(64, 32),)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=DEAR_MEMORY, strict=True, **settings)
    assert_grads_close(grads, expected)
    assert _matmuls(reports[0]) == []
    assert reports[0].default_plan_saved_bytes == reports[0].saved_bytes


@pytest.mark.parametrize("settings", [dict(memory_budget=0.0), dict(memory_budget=0.5)], ids=str)
def test_a_budget_may_recompute_matmuls(settings):
    model, inputs = Mlp(), (torch.randn(64, 32),)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=DEAR_MEMORY, strict=True, **settings)
    assert_grads_close(grads, expected)
    assert _matmuls(reports[0])


def test_the_rule_costs_saved_bytes_only_where_it_binds():
    """At the default price of memory nothing here is worth recomputing a Linear for: the rule changes nothing;
    priced dear, the default keeps more than the unrestricted cut (memory_budget's 1.0 end) would."""
    model, inputs = Mlp(), (torch.randn(64, 32),)
    _, _, _, cheap = run_fxremat_aot(model, inputs, strict=True, compare_default=True)
    _, _, _, dear = run_fxremat_aot(model, inputs, memory_price=DEAR_MEMORY, strict=True, compare_default=True)
    assert cheap[0].saved_bytes == cheap[0].frontier[0][0]
    assert dear[0].saved_bytes > dear[0].frontier[0][0]
