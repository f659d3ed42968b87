"""Per-region budgets under real Inductor (issue #23): two regions of 4 x Linear(64, 64) + ReLU at budgets 0.0 and
1.0 through ``torch.compile(backend=fxremat.backend())``; saved bytes measured with ``saved_tensors_hooks``, every
gradient against eager.  One compile (about 15 s of C++ here)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import fxremat
from fxremat.measure import measure_saved
from fxremat_passes import _torch_private as tp
from fxremat_passes.choice.regions import region_name

pytestmark = pytest.mark.inductor


class TwoBlocks(nn.Module):
    """Two stacks of 4 x Linear(64, 64) + ReLU, each under its own budget (None: no region, for eager)."""

    def __init__(self, budgets):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())]) for _ in budgets]
        )
        self.budgets = budgets

    def forward(self, x):
        for block, budget in zip(self.blocks, self.budgets):
            if budget is None:
                x = block(x)
            else:
                with tp.region_memory_budget(budget):
                    x = block(x)
        return x


def test_two_regions_under_inductor_keep_their_own_budgets_and_right_gradients():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoBlocks((0.0, 1.0))
    eager = copy.deepcopy(model)
    eager.budgets = (None, None)  # the annotation raises in eager mode
    x = torch.randn(32, 64, requires_grad=True)
    backend = fxremat.backend(strict=True)
    compiled = torch.compile(model, backend=backend)
    out, saved = measure_saved(lambda: compiled(x), [*model.parameters(), x])
    out.sum().backward()
    eager(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    (report,) = backend.reports
    rows = {row[0]: row[1:] for row in report.region_budgets}
    zero, one = rows[region_name(0.0)], rows[region_name(1.0)]
    assert zero[1] == zero[4] and one[1] == one[3] > zero[1]  # fewest bytes at 0.0, the default plan's at 1.0
    assert report.saved_bytes == saved.nbytes == sum(row[1] for row in rows.values())
