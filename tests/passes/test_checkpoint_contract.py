"""User checkpoints as a memory contract (issue #22, passes/choice/contract.py), through Dynamo and AOTAutograd with
no-op compilers: with ``torch.utils.checkpoint`` regions in the graph, fxremat's default plan saves no more than
the user's plan, measured by saved-tensor hooks against two independent references (PyTorch's partition, and
fxremat with every region op tagged MUST_RECOMPUTE); gradients equal eager."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import aot_eager, assert_grads_close, eager_grads
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import fxremat
from fxremat.examples import Block
from fxremat.measure import measure_saved
from fxremat.options import Options
from fxremat_passes import _torch_private as tp


class Layer(nn.Module):
    """Issue #22's model A: Linear -> LayerNorm -> GELU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.ln = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x):
        return F.gelu(self.ln(self.fc(x)))


def _must_recompute(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_RECOMPUTE


class Checkpointed(nn.Module):
    """Every layer in its own checkpoint region; ``must_recompute``: a SAC policy tagging every op MUST_RECOMPUTE
    (the user's plan with no room for fxremat's costs: the reference the default plan is measured against)."""

    def __init__(self, layers: list[nn.Module], must_recompute: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.must_recompute = must_recompute

    def forward(self, x):
        for layer in self.layers:
            if self.must_recompute:
                context = functools.partial(create_selective_checkpoint_contexts, _must_recompute)
                x = checkpoint(layer, x, use_reentrant=False, context_fn=context)
            else:
                x = checkpoint(layer, x, use_reentrant=False)
        return x


MODELS = {
    # width 384: wide enough that recomputing a Linear costs more than ten times keeping its output (issue #22)
    "linear_ln_gelu": (lambda: [Layer(384) for _ in range(4)], (64, 384)),
    "transformer_blocks": (lambda: [Block(64) for _ in range(3)], (2, 32, 64)),
}


def _step(model, x, partition_fn):
    """One step of ``model`` compiled by Dynamo with ``partition_fn``: (saved tensors, gradients)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_eager(partition_fn))
    model.zero_grad(set_to_none=True)
    out, saved = measure_saved(lambda: compiled(x), [*model.parameters(), x])
    out.sum().backward()
    return saved, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _fxremat(model, x, **options):
    reports: list = []
    saved, grads = _step(model, x, fxremat.make_partition_fn(Options.create(strict=True, **options), reports))
    (report,) = reports
    return saved, grads, report


@pytest.mark.parametrize("name", MODELS)
def test_default_saves_no_more_than_the_users_plan(name):
    build, shape = MODELS[name]
    layers = build()
    model, x = Checkpointed(layers), torch.randn(*shape)
    _, expected = eager_grads(model, (x,))
    saved, grads, report = _fxremat(model, x)
    assert_grads_close(grads, expected)
    assert report.saved_bytes == saved.nbytes
    # the report's own ceiling, and the contract: no more bytes, no higher simulated peak
    assert report.user_plan_saved_bytes is not None
    assert report.saved_bytes <= report.user_plan_saved_bytes
    assert report.simulated_peak_bytes <= report.user_plan_simulated_peak_bytes
    # two references measured apart: PyTorch's partition of the same graph, and every region op MUST_RECOMPUTE
    pytorch, pytorch_grads = _step(model, x, tp.min_cut_rematerialization_partition)
    assert_grads_close(pytorch_grads, expected)
    must = Checkpointed(copy.deepcopy(layers), must_recompute=True)
    must_saved, must_grads, _ = _fxremat(must, x, checkpoints="replan")
    assert_grads_close(must_grads, expected)
    assert saved.nbytes <= min(pytorch.nbytes, must_saved.nbytes), (saved, pytorch, must_saved)
    assert not [why for _, why in report.checkpoint_kept if "re-planned" not in why and "never" not in why]


def test_replan_hands_the_regions_to_fxremats_costs():
    """Issue #22's A: at fxremat's costs the Linear outputs are worth keeping (a 10x bias on saving them is not
    enough), so ``replan`` keeps them, says why, and saves more than the contract lets the default save."""
    layers = MODELS["linear_ln_gelu"][0]()
    model, x = Checkpointed(layers), torch.randn(*MODELS["linear_ln_gelu"][1])
    _, expected = eager_grads(model, (x,))
    honoured, _, honour_report = _fxremat(model, x)
    replanned, grads, report = _fxremat(model, x, checkpoints="replan")
    assert_grads_close(grads, expected)
    assert replanned.nbytes > honoured.nbytes
    assert report.user_plan_saved_bytes is None
    kept = dict(report.checkpoint_kept)
    assert kept and all(why.startswith("checkpoints='replan'") for why in kept.values())
    assert {r.op for r in report.saved if r.name in kept} == {"aten.addmm"}
    assert any(why == "tagged PREFER_RECOMPUTE, honoured" for _, why in honour_report.recompute_reasons)


@pytest.mark.parametrize("options", [dict(memory_budget=0.5), dict(peak_budget=0.5), dict(peak_budget=10**9)])
def test_budgets_apply_on_top_of_the_contract(options):
    build, shape = MODELS["transformer_blocks"]
    model, x = Checkpointed(build()), torch.randn(*shape)
    _, expected = eager_grads(model, (x,))
    saved, grads, report = _fxremat(model, x, **options)
    assert_grads_close(grads, expected)
    assert saved.nbytes == report.saved_bytes <= report.user_plan_saved_bytes
    assert report.simulated_peak_bytes <= report.user_plan_simulated_peak_bytes
    if "memory_budget" in options:
        assert report.budget_met and report.saved_bytes <= report.budget_bytes
    else:
        assert report.peak_budget_bytes <= report.user_plan_simulated_peak_bytes


def test_graph_without_tags_is_unchanged_by_the_option():
    model, x = nn.Sequential(*MODELS["linear_ln_gelu"][0]()), torch.randn(*MODELS["linear_ln_gelu"][1])
    reports = [_fxremat(model, x, checkpoints=mode)[2] for mode in ("honour", "replan")]
    assert reports[0].user_plan_saved_bytes is None and not reports[0].checkpoint_kept
    assert [r.name for r in reports[0].saved] == [r.name for r in reports[1].saved]


def test_checkpoints_option_is_validated_and_keyed():
    with pytest.raises(ValueError, match="checkpoints='keep'.*'honour'.*'replan'"):
        fxremat.backend(checkpoints="keep")
    keys = {Options.create(checkpoints=mode).cache_key() for mode in ("honour", "replan")}
    assert len(keys) == 2


class TwicePass(nn.Module):
    """Issue #22's model B, small: the same checkpointed blocks over ``x``, then over their output plus ``context``."""

    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))

    def run(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    def forward(self, x, context):
        first = self.run(x)
        return first.square().mean() + self.run(first + context).square().mean()


def test_peak_budget_zero_is_the_lowest_setting_on_blocks_run_twice():
    """``peak_budget=0.0`` segments the lowest shortlisted plans too, not only the fewest-bytes one: on model B the
    lowest is a plan keeping more bytes, recomputed segment by segment (before: above ``memory_budget=0.2``'s)."""
    model, inputs = TwicePass(2, 64), (torch.randn(2, 64, 64), torch.randn(2, 64, 64))
    _, expected = eager_grads(model, inputs, loss=lambda out: out)
    peaks = {}
    for options in (
        {},
        dict(memory_budget=0.5),
        dict(memory_budget=0.2),
        dict(memory_budget=0.0),
        dict(peak_budget=0.5),
        dict(peak_budget=0.0),
    ):
        torch._dynamo.reset()
        reports: list = []
        partition = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)
        model.zero_grad(set_to_none=True)
        torch.compile(model, backend=aot_eager(partition))(*inputs).backward()
        assert_grads_close({n: p.grad for n, p in model.named_parameters()}, expected)
        (report,) = reports
        peaks[tuple(options.items())] = report.simulated_peak_bytes
    lowest = peaks[(("peak_budget", 0.0),)]
    assert lowest <= min(peaks.values()), peaks
    assert lowest < peaks[(("memory_budget", 0.0),)], peaks
