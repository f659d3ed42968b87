"""The default plan saves a residual stream's block sums, not the projections they add (issue #16: otherwise each
layer's norm backward recomputes a longer sum, one more distinct kernel per layer).  No Inductor."""

from __future__ import annotations

import torch
from helpers import assert_grads_close, eager_grads, run_fxremat_aot

from fxremat.examples import Stack
from fxremat_passes.choice import default
from fxremat_passes.graph.stored_sums import block_sums, reads_only


def _stack():
    torch.manual_seed(0)
    model = Stack(depth=3, dim=64)
    for block in model.blocks:  # traced without Dynamo, a dropout of 0 stays as a clone between the sum and its term
        block.drop = torch.nn.Identity()
    return model, (torch.randn(2, 32, 64),)


def _run(model, inputs, monkeypatch) -> tuple[set[str], dict, list]:
    """fxremat's default partition through aot_autograd: (the block sums it found, gradients, reports)."""
    found: set[str] = set()

    def recording(roles, nodes):
        sums = block_sums(roles, nodes)
        found.update(nodes[i].name for i in sums)
        return sums

    monkeypatch.setattr(default, "block_sums", recording)
    _, grads, _, reports = run_fxremat_aot(model, inputs, strict=True)
    return found, grads, reports


def test_default_plan_saves_the_block_sums_at_no_more_memory(monkeypatch):
    model, inputs = _stack()
    _, expected = eager_grads(model, inputs)
    sums, grads, reports = _run(model, inputs, monkeypatch)
    # both sums of every block but the last one (the model's output: nothing else in forward reads it)
    assert len(sums) == 5 and all(n.startswith("add") for n in sums), sums
    assert_grads_close(grads, expected)
    saved = {s.name for s in reports[0].saved}
    assert sums <= saved, sums - saved
    # the plan the cut makes without them: the projections saved instead, the same bytes, a peak no lower
    monkeypatch.setattr(default, "block_sums_plan", lambda plan, *args: plan)
    _, _, _, before = run_fxremat_aot(model, inputs, strict=True)
    assert not sums & {s.name for s in before[0].saved}
    assert reports[0].saved_bytes <= before[0].saved_bytes
    assert reports[0].simulated_peak_bytes <= before[0].simulated_peak_bytes


def test_reads_only_prices_one_read():
    from fxremat_passes.solver.parametric import ParametricProblem

    problem = ParametricProblem(
        num_values=2,
        storage=(0, 1),
        storage_bytes=(100, 100),
        traffic_seconds=(2.0, None),
        save_scale=(1.0, 1.0),
        recompute_seconds=(1.0, 1.0),
        edges=((0, 1),),
        needed=(1,),
    )
    changed = reads_only(problem, [0, 1], bandwidth=100.0)
    assert changed.traffic_seconds == (1.0, None)  # 100 bytes at 100 B/s; a value that may not be saved stays so
    assert problem.traffic_seconds == (2.0, None)
