"""PyTorch's memory knobs and tags under fxremat (issue #23): the global ``activation_memory_budget``, the other
``torch._functorch.config`` knobs its partitioner reads, ``region_activation_memory_budget`` annotations, and a
MUST_RECOMPUTE policy at a size where the plan matters.  Through AOTAutograd (and Dynamo where the feature needs
it) with no-op compilers."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn as nn
from helpers import noop_compiler, run_aot, run_fxremat_aot
from torch._functorch import config as functorch_config

import fxremat
from fxremat import knobs
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.region_budget import REGION_SOURCE


def linear_relu_stack(width: int = 64, depth: int = 4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers), (torch.randn(32, width, requires_grad=True),)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(knobs, "_warned", set())


# --- torch._functorch.config.activation_memory_budget -----------------------------------------------------------


def test_torchs_global_budget_is_fxremats_budget_when_fxremat_sets_none():
    """The issue's row: 4 x Linear(64, 64) + ReLU with PyTorch's knob at 0.0 saved 53,248 bytes (the default plan)."""
    model, inputs = linear_relu_stack()
    with functorch_config.patch(activation_memory_budget=0.0):
        _, _, theirs = run_aot(model, inputs, tp.min_cut_rematerialization_partition)
        _, _, saved, reports = run_fxremat_aot(model, inputs, strict=True)
    (report,) = reports
    assert report.memory_budget == 0.0 and report.memory_budget_source == knobs.TORCH_CONFIG_SOURCE
    assert report.saved_bytes == saved.nbytes <= theirs.nbytes == 0
    assert "from torch._functorch.config" in fxremat.format_text(report)
    _, _, _, reports = run_fxremat_aot(model, inputs, strict=True)
    assert reports[0].memory_budget is None and reports[0].memory_budget_source is None


def test_fxremats_own_budget_wins_with_one_warning_naming_both():
    model, inputs = linear_relu_stack(depth=2)
    with functorch_config.patch(activation_memory_budget=0.0), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, _, first = run_fxremat_aot(model, inputs, strict=True, memory_budget=1.0)
        _, _, _, second = run_fxremat_aot(model, inputs, strict=True, memory_budget=1.0)
    messages = [str(w.message) for w in caught if issubclass(w.category, fxremat.FxrematKnobWarning)]
    assert len(messages) == 1 and "memory_budget=1.0" in messages[0] and "=0.0" in messages[0], messages
    assert first[0].memory_budget == second[0].memory_budget == 1.0
    assert first[0].memory_budget_source == knobs.FXREMAT_SOURCE
    assert first[0].saved_bytes > 0


def test_torchs_global_budget_is_in_the_cache_key():
    options = Options.create()
    with functorch_config.patch(activation_memory_budget=0.5):
        half = options.cache_key()
    assert half != options.cache_key()
    with functorch_config.patch(activation_memory_budget=0.5):  # fxremat's own budget: torch's changes nothing
        assert Options.create(memory_budget=0.3).cache_key() == Options.create(memory_budget=0.3).cache_key()


def test_a_bad_torch_budget_is_refused_naming_the_knob():
    model, inputs = linear_relu_stack(depth=1)
    with functorch_config.patch(activation_memory_budget=1.5), pytest.raises(ValueError, match="activation_memo"):
        run_fxremat_aot(model, inputs, strict=True)


@pytest.mark.parametrize("name", sorted(knobs.IGNORED_KNOBS))
def test_each_ignored_knob_warns_once_when_set(name):
    default = tp.functorch_knob_default(name)
    value = {bool: not default, int: 7, str: "greedy"}.get(type(default), "x")
    model, inputs = linear_relu_stack(depth=1)
    with functorch_config.patch(**{name: value}), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_fxremat_aot(model, inputs, strict=True)
        run_fxremat_aot(model, inputs, strict=True)
    messages = [str(w.message) for w in caught if issubclass(w.category, fxremat.FxrematKnobWarning)]
    assert len(messages) == 1 and name in messages[0], messages


def test_no_knob_warning_at_torchs_defaults():
    model, inputs = linear_relu_stack(depth=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxremat.FxrematKnobWarning)
        run_fxremat_aot(model, inputs, strict=True)


# --- region_activation_memory_budget (Dynamo) ---------------------------------------------------------------------


def compile_step(fn, x, **options):
    torch._dynamo.reset()
    reports: list = []
    partition = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)
    backend = tp.aot_autograd(fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition)
    torch.compile(fn, backend=backend)(x).sum().backward()
    return reports


def _block(x):
    return torch.relu(x @ torch.full((64, 64), 1 / 64)).sin()


def mlp(x, budgets=(0.0, 0.0), cover=(True, True)):
    for budget, covered in zip(budgets, cover):
        if covered:
            with tp.region_memory_budget(budget):
                x = _block(x)
        else:
            x = _block(x)
    return x


def test_region_budget_is_the_graphs_budget():
    x = torch.randn(64, 64, requires_grad=True)
    (plain,) = compile_step(functools.partial(mlp, cover=(False, False)), x)
    (region,) = compile_step(mlp, x)
    assert plain.saved_bytes > 0 and plain.memory_budget_source is None
    assert region.memory_budget == 0.0 and region.memory_budget_source == REGION_SOURCE
    assert region.saved_bytes == 0


def test_region_budgets_that_give_no_single_budget_are_per_region_budgets():
    """PyTorch refuses both (one budget per graph); fxremat holds each region to its own budget
    (tests/passes/test_region_budgets.py has the sizes where the plan matters)."""
    x = torch.randn(64, 64, requires_grad=True)
    (two,) = compile_step(functools.partial(mlp, budgets=(0.0, 0.5)), x)
    (partial,) = compile_step(functools.partial(mlp, cover=(True, False)), x)
    assert [row[:2] for row in two.region_budgets][:2] == [
        ("region_activation_memory_budget(0.0)", 0.0),
        ("region_activation_memory_budget(0.5)", 0.5),
    ]
    assert partial.region_budgets[0][:3] == ("region_activation_memory_budget(0.0)", 0.0, 0)
    assert two.budget_met and partial.budget_met


# --- MUST_RECOMPUTE per storage: upstream's shape at 64 x 64 ----------------------------------------------------


def _mm_must_recompute(ctx, func, *args, **kwargs):
    if func is torch.ops.aten.mm.default:
        return tp.CheckpointPolicy.MUST_RECOMPUTE
    return tp.CheckpointPolicy.PREFER_RECOMPUTE


def _sac(x):
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    def gn(x):
        return torch.cos(torch.sin(torch.matmul(x, x) @ x))

    context = functools.partial(create_selective_checkpoint_contexts, _mm_must_recompute)
    return checkpoint(gn, x, use_reentrant=False, context_fn=context)


def test_must_recompute_holds_for_views_and_backward_formulas():
    """PyTorch's outcome: both mms recomputed (6 mms in backward), nothing saved of them.  Was: ``t(mm)`` saved
    (its storage is the tagged mm) and ``cos(mm_1)`` computed in forward and saved: 4 mms in backward."""
    counts = {}

    def counting(name):
        def compiler(gm, example_inputs):
            counts[name] = sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes)
            return noop_compiler(gm, example_inputs)

        return compiler

    torch._dynamo.reset()
    reports: list = []
    partition = fxremat.make_partition_fn(Options.create(strict=True, memory_price=0.0), reports)
    backend = tp.aot_autograd(fw_compiler=counting("fw"), bw_compiler=counting("bw"), partition_fn=partition)
    x = torch.randn(64, 64, requires_grad=True)
    torch.compile(_sac, backend=backend)(x).sum().backward()
    (report,) = reports
    assert counts == {"fw": 2, "bw": 6}
    assert report.saved_bytes == 0 and not report.tag_conflicts
    assert {row.storage for row in report.saved} <= {"primals_1"}


def test_region_budget_reads_annotations_and_the_legacy_marker():

    from fxremat_passes.graph.region_budget import legacy_budget, read_regions

    gm = torch.fx.symbolic_trace(lambda x: (torch.cos(torch.sin(x)),))
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert legacy_budget(gm) is None and read_regions(gm, 1).budgets == ()
    ops[1].meta["memory_budget"] = 0.25
    assert legacy_budget(gm) == 0.25
    for node, budget in zip(ops, (0.5, 0.5)):
        node.meta["custom"] = {tp.MEMORY_BUDGET_ANNOTATION_KEY: budget}
    assert read_regions(gm, 1).whole_graph_budget == 0.5  # one region over the whole forward: the graph's budget
    options, source, regions = knobs.effective_options(Options.create(), gm, 1)
    assert (options.memory_budget, source, regions) == (0.5, REGION_SOURCE, None)  # it wins over the legacy one
    ops[1].meta["custom"] = {tp.MEMORY_BUDGET_ANNOTATION_KEY: 0.0}
    options, source, regions = knobs.effective_options(Options.create(), gm, 1)
    assert regions.budgets == (0.5, 0.0) and (options.memory_budget, source) == (0.25, knobs.LEGACY_SOURCE)


def test_cpu_offload_tags_are_kept_out_loud():
    """MUST_CPU_OFFLOAD is saved as PyTorch saves it, PREFER_CPU_OFFLOAD weighed as PREFER_SAVE, with one warning
    that fxremat does not offload them (docs/DESIGN.md §16)."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    import fxremat
    from fxremat import knobs

    def offload_matmuls(ctx, op, *args, **kwargs):
        mm = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return CheckpointPolicy.MUST_CPU_OFFLOAD if mm else CheckpointPolicy.PREFER_RECOMPUTE

    class Tagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            def body(x):
                return self.fc2(torch.tanh(self.fc1(x)))

            context = functools.partial(create_selective_checkpoint_contexts, offload_matmuls)
            return checkpoint(body, x, use_reentrant=False, context_fn=context)

    knobs._warned.clear()
    torch._dynamo.reset()
    model, x = Tagged(), torch.randn(8, 32, requires_grad=True)
    backend = fxremat.backend(memory_budget=0.0)
    with pytest.warns(knobs.FxrematKnobWarning, match="MUST_CPU_OFFLOAD"):
        out = torch.compile(model, backend=backend)(x)
    out.sum().backward()
    (report,) = backend.reports
    assert not [r for r in report.recomputed if "mm" in r.name]  # the tagged matmuls are saved, even at budget 0.0
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want)
