"""Several ``region_activation_memory_budget`` regions in one graph (issue #23): each region keeps at most its own
budget (a fraction of what that region keeps in fxremat's default plan), in one solve with the rest of the graph,
which keeps its own setting.  Through Dynamo and AOTAutograd with no-op compilers, gradients against eager."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
from helpers import noop_compiler

import fxremat
from fxremat import knobs
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes.choice.regions import OUTSIDE, region_name
from fxremat_passes.graph.region_budget import REGION_SOURCE, RegionBudgetError, read_regions

WIDTH = 64


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(knobs, "_warned", set())


def linear_relu(depth: int = 4) -> nn.Sequential:
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())])


class TwoBlocks(nn.Module):
    """Two stacks of 4 x Linear(64, 64) + ReLU, each under its own budget (None: outside every region)."""

    def __init__(self, budgets):
        super().__init__()
        self.blocks = nn.ModuleList([linear_relu(), linear_relu()])
        self.budgets = budgets

    def forward(self, x):
        for block, budget in zip(self.blocks, self.budgets):
            if budget is None:
                x = block(x)
            else:
                with tp.region_memory_budget(budget):
                    x = block(x)
        return x


def compile_step(model, x, **options):
    """One step through Dynamo + AOTAutograd with fxremat (strict); gradients checked against eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    reference = copy.deepcopy(model)
    reference.budgets = (None,) * len(model.budgets)  # the annotation raises in eager mode
    reference(x).sum().backward()
    reports: list = []
    partition = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)
    backend = tp.aot_autograd(fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition)
    torch.compile(model, backend=backend)(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    (report,) = reports
    return report


def rows(report) -> dict:
    """region name -> (budget, saved bytes, budget bytes, default plan's bytes, fewest-bytes plan's bytes)."""
    return {row[0]: row[1:] for row in report.region_budgets}


def _x():
    torch.manual_seed(1)
    return torch.randn(32, WIDTH, requires_grad=True)


@pytest.mark.parametrize("budgets", [(0.0, 1.0), (1.0, 0.0)])
def test_a_region_at_zero_and_one_at_one_keep_their_fewest_and_their_default(budgets):
    torch.manual_seed(0)
    report = compile_step(TwoBlocks(budgets), _x())
    regions = rows(report)
    assert report.budget_met is True and report.plan_method != "mincut"
    for budget in budgets:
        _, saved, target, default, fewest = regions[region_name(budget)]
        assert default > fewest  # the plan matters at this size
        assert saved <= target == (fewest if budget == 0.0 else default)
        assert saved == target  # the region at 1.0 keeps what it keeps in the default plan, the one at 0.0 nothing
    assert report.saved_bytes == sum(row[1] for row in regions.values())  # the split keeps what the plan counted


def test_two_budgets_keep_different_bytes_per_region_each_within_its_own():
    torch.manual_seed(0)
    report = compile_step(TwoBlocks((0.3, 0.7)), _x())
    regions = rows(report)
    low, high = regions[region_name(0.3)], regions[region_name(0.7)]
    assert low[3] == high[3] and low[4] == high[4]  # the same blocks: the same default and fewest bytes
    for budget, saved, target, default, fewest in (low, high):
        assert target == int(fewest + budget * (default - fewest)) and saved <= target
    assert low[1] < high[1]  # different budgets, different bytes kept
    assert report.saved_bytes == low[1] + high[1] + regions[OUTSIDE][1]
    again = fxremat.CutReport.from_dict(json.loads(report.to_json(compute_deferred=False)))
    assert again.region_budgets == report.region_budgets  # the JSON row, docs/REPORT.md "Report JSON schema"
    torch.manual_seed(0)
    swapped = rows(compile_step(TwoBlocks((0.7, 0.3)), _x()))
    assert swapped[region_name(0.3)][1] == low[1] and swapped[region_name(0.7)][1] == high[1]


def test_the_rest_of_the_graph_keeps_its_own_setting():
    torch.manual_seed(0)
    plain = compile_step(TwoBlocks((None, None)), _x())
    torch.manual_seed(0)
    default_rest = compile_step(TwoBlocks((0.0, None)), _x())
    regions = rows(default_rest)
    assert default_rest.memory_budget is None and default_rest.memory_budget_source is None
    assert regions[region_name(0.0)][1] == 0
    assert 0 < regions[OUTSIDE][1] == regions[OUTSIDE][3]  # outside: the default price, what its default plan keeps
    assert plain.saved_bytes > default_rest.saved_bytes
    torch.manual_seed(0)
    tight_rest = compile_step(TwoBlocks((1.0, None)), _x(), memory_budget=0.0)
    regions = rows(tight_rest)
    assert tight_rest.memory_budget == 0.0 and tight_rest.memory_budget_source == knobs.FXREMAT_SOURCE
    assert regions[OUTSIDE][0] == 0.0 and regions[OUTSIDE][1] == regions[OUTSIDE][4]  # the rest at its fewest
    assert regions[region_name(1.0)][1] == regions[region_name(1.0)][3] > 0  # the region at its default
    assert "per-region budgets (met)" in fxremat.format_text(tight_rest)


def test_one_region_over_the_whole_forward_is_still_the_graphs_budget():
    torch.manual_seed(0)
    report = compile_step(TwoBlocks((0.5, 0.5)), _x())
    assert report.memory_budget == 0.5 and report.memory_budget_source == REGION_SOURCE
    assert report.region_budgets == () and report.budget_met


def test_the_milp_solver_meets_every_region_too():
    torch.manual_seed(0)
    report = compile_step(TwoBlocks((0.3, 0.0)), _x(), solver="milp")
    for budget, saved, target, _, _ in rows(report).values():
        assert budget is None or saved <= target


def test_peak_budget_with_several_regions_is_refused_naming_the_fix():
    torch.manual_seed(0)
    with pytest.raises(Exception, match="peak_budget") as info:  # Dynamo wraps what the backend raises
        compile_step(TwoBlocks((0.0, 1.0)), _x(), peak_budget=0.5)
    assert RegionBudgetError.__name__ in str(info.value) and "graph break" in str(info.value)


def _annotate(node: torch.fx.Node, budget) -> None:
    node.meta["custom"] = {tp.MEMORY_BUDGET_ANNOTATION_KEY: budget}


def test_read_regions_reads_budgets_and_refuses_what_it_cannot_apply():
    gm = torch.fx.symbolic_trace(lambda x: (torch.cos(torch.sin(x)),))
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert read_regions(gm, 1).budgets == ()
    _annotate(ops[0], 0.0)
    partial = read_regions(gm, 1)
    assert partial.budgets == (0.0,) and partial.uncovered == (ops[1].name,) and partial.several
    _annotate(ops[1], 0.0)
    assert read_regions(gm, 1).whole_graph_budget == 0.0
    _annotate(ops[1], 0.5)
    assert read_regions(gm, 1).budgets == (0.0, 0.5) and read_regions(gm, 1).several
    _annotate(ops[1], 1.5)
    with pytest.raises(RegionBudgetError, match=r"budget 1.5; a budget is a float in \[0, 1\]"):
        read_regions(gm, 1)


@pytest.mark.parametrize("body_budgets", [(0.0, 0.5), (0.0, None)])
def test_a_subgraph_body_with_two_budgets_or_a_partial_one_is_refused(body_budgets):
    outer = torch.fx.symbolic_trace(lambda x: (torch.cos(x),))
    body = torch.fx.symbolic_trace(lambda x: torch.sin(torch.exp(x)))
    for node, budget in zip([n for n in body.graph.nodes if n.op == "call_function"], body_budgets):
        if budget is not None:
            _annotate(node, budget)
    outer.add_submodule("body", body)
    with pytest.raises(RegionBudgetError, match="subgraph body 'body'") as info:
        read_regions(outer, 1)
    assert "one region" in str(info.value)


def test_the_compile_cache_key_sees_which_ops_carry_which_budget(monkeypatch):
    """AOTAutograd's cache key reads the first node's budget only, and the graph's code does not show regions: the
    same code with a region moved or a budget changed must not reuse a cached partition (fxremat's uuid)."""
    import torch._inductor.compile_fx as compile_fx_module

    keys: list = []

    def fake_compile_fx(gm, example_inputs, config_patches, **kwargs):  # kwargs: the backend's inner_compile
        keys.append(config_patches["custom_partitioner_fn"].uuid())
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    for budgets in [(None, None), (0.0, None), (0.0, 0.5), (0.0, 0.7), (None, 0.0)]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        torch.compile(TwoBlocks(budgets), backend=fxremat.backend())(_x())
    assert len(keys) == len(set(keys)) == 5
    from fxremat_passes.rewrite.layout_choice import LayoutChoice

    plain = fxremat.backend()._partitioner
    plain.current_layout = LayoutChoice()  # a CPU compile's: fxremat chooses its layout
    assert plain.uuid() == keys[0]  # no regions: the key as before


def test_pytorchs_baseline_and_the_fallback_run_without_the_regions_pytorch_refuses():
    """PyTorch's partitioner raises on per-region budgets: the report's baseline is its default plan without them,
    and an internal failure still falls back to it, with the warning saying the regions were not applied."""
    from fxremat.partition import FxrematFallbackWarning, inject_fault

    torch.manual_seed(0)
    compared = compile_step(TwoBlocks((0.0, 1.0)), _x(), compare_default=True)
    assert compared.baseline_error is None and compared.baseline_saved_bytes > 0
    assert len(compared.region_budgets) == 3  # the baseline ran first: the annotations were back for fxremat
    torch.manual_seed(0)
    model, reports = TwoBlocks((0.0, 1.0)), []
    partition = fxremat.make_partition_fn(Options.create(), reports)
    torch._dynamo.reset()
    backend = tp.aot_autograd(fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition)
    with inject_fault("solve_min_cut"), pytest.warns(FxrematFallbackWarning, match=r"per-region budgets \[0.0, 1.0\]"):
        torch.compile(model, backend=backend)(_x()).sum().backward()
    assert reports[0].fallback_reason and reports[0].saved_bytes > 0
