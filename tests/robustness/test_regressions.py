"""Concrete modules for every failure the fuzzer (or the robustness tests) found, smallest form first.

A library bug stays here as a strict xfail until it is fixed: the fix turns it into an XPASS, which fails the run
and asks for the marker to go.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fuzz_models import FuzzModel, Program, Step, fresh, loss_of, make_inputs
from helpers import aot_eager
from robust_helpers import FP32_RTOL, TaggedDropout, assert_steps_match, eager_step, fxremat_step

import fxremat
from fxremat.options import Options

# The default cut, and price 0 (saving is free): before the fix even price 0 chose the recompute, as a fused pointwise
# op is cheaper than the traffic of keeping its result.
CONFIGS = [dict(memory_budget=None), dict(memory_price=0.0)]


def weighted_sum(out):
    """Not a plain sum: distinct weights per element, so that a wrong gradient cannot cancel out."""
    return (out * torch.linspace(-1.0, 2.0, out.numel()).view(out.shape)).sum()


# --- reads of a mutated graph input (found by the fuzzer: Program(aux=True, ...)) ----------------------------------
# AOTAutograd writes a forward's input/buffer mutations back into the input after the forward; a reader of that
# input recomputed in backward read the new value: a silently wrong gradient through aot_module, a version-counter
# error under Dynamo.  Fixed in 46ec05a (readers of mutated inputs are never recomputed).


class MutateInputThenRead(nn.Module):
    """aux.add_(1) then x * aux: backward needs the new aux (saved), never aux + 1 recomputed from the input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x, aux):
        aux.add_(1.0)
        return (x * aux) @ self.w


class ReadThenMutateInput(nn.Module):
    """tanh(x + aux) @ w, then aux.add_(1): a recompute of x + aux in backward would read the new aux."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x, aux):
        y = torch.tanh(x + aux) @ self.w
        aux.add_(1.0)
        return y


class StepCounterBuffer(nn.Module):
    """A buffer updated in forward and read after (a step counter, a running scale): the same bug, on a buffer."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("count", torch.ones(4))

    def forward(self, x, aux):
        self.count.add_(1.0)
        return torch.tanh(x * self.count) @ self.w


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=generator).requires_grad_(), torch.randn(3, 4, generator=generator)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("module", [MutateInputThenRead, ReadThenMutateInput, StepCounterBuffer])
def test_reader_of_a_mutated_input_is_not_recomputed(module, config):
    torch.manual_seed(0)
    model, inputs = module(), _inputs()
    expected = eager_step(model, fresh(inputs), weighted_sum)
    actual = fxremat_step(model, fresh(inputs), weighted_sum, strict=True, **config)
    assert_steps_match(actual, expected, FP32_RTOL, f"{module.__name__} {config}")


def test_reader_of_a_mutated_input_through_torch_compile():
    torch.manual_seed(0)
    model, (x, aux) = MutateInputThenRead(), _inputs()
    eager = copy.deepcopy(model)
    partition_fn = fxremat.make_partition_fn(Options.create(strict=True), [])
    compiled = torch.compile(model, backend=aot_eager(partition_fn))
    x1, aux1 = fresh((x, aux))
    weighted_sum(compiled(x1, aux1)).backward()
    x2, aux2 = fresh((x, aux))
    weighted_sum(eager(x2, aux2)).backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(model.w.grad, eager.w.grad)


def test_fuzzer_program_with_a_mutated_input():
    """The fuzzer's own shrunk case: x * aux (aux mutated first), then tanh(x @ W) @ W."""
    program = Program((2, 2), (Step("linear_twice", (0,), (2,)),), (1,), aux=True)
    torch.manual_seed(0)
    model, inputs = FuzzModel(program), make_inputs(program)
    expected = eager_step(model, fresh(inputs), loss_of)
    actual = fxremat_step(model, fresh(inputs), loss_of, strict=True)
    assert_steps_match(actual, expected, FP32_RTOL)


# --- SAC MUST_RECOMPUTE on a dropout, without Inductor's RNG decomposition -------------------------------------------

# Fixed (roles.classify: a MUST_RECOMPUTE value that cannot be recomputed is saved, as a tag conflict):
# Was: a MUST_RECOMPUTE tag on native_dropout is overridden (random op), but not on its getitem outputs: the mask can
# be neither saved (tagged MUST_RECOMPUTE) nor recomputed (its producer never is), and the cut is infeasible
# (InfeasibleCutError) instead of a tag conflict (TaggedDropout: robust_helpers)


def test_must_recompute_tag_on_dropout_is_a_conflict():
    """Dynamo + AOTAutograd without Inductor (aot_eager-style): native_dropout and its mask reach the partitioner."""
    torch.manual_seed(0)
    model, reports = TaggedDropout(), []
    partition_fn = fxremat.make_partition_fn(Options.create(strict=True), reports)
    compiled = torch.compile(model, backend=aot_eager(partition_fn))
    y = compiled(torch.randn(8, 32))
    y.sum().backward()
    assert 0.2 < (y == 0).float().mean().item() < 0.8  # a mask was drawn: otherwise the identity below is trivial
    implied = (y.detach() / model.w.detach()).sum(0)
    torch.testing.assert_close(model.w.grad, implied, rtol=1e-5, atol=1e-6)
    (report,) = reports
    assert "aten.native_dropout" not in {r.op for r in report.recomputed}
    assert any("random" in why for _, why in report.tag_conflicts), report.tag_conflicts


def test_must_recompute_tag_on_dropout_through_aot_module():
    torch.manual_seed(0)
    model = TaggedDropout()
    result = fxremat_step(model, (torch.randn(8, 32),), lambda out: out.sum(), strict=True)
    assert 0.2 < (result.outputs[0] == 0).float().mean().item() < 0.8  # a mask was drawn
    implied = (result.outputs[0] / model.w.detach()).sum(0)
    torch.testing.assert_close(result.grads["param w"], implied, rtol=1e-5, atol=1e-6)
    assert any("random" in why for _, why in result.reports[0].tag_conflicts)


# --- a dead random op in a graph whose backward needs nothing (found by the fuzzer) ------------------------------

# Fixed (partition: the plain split is our own, saving nothing):
# Was: with nothing for backward to read, fxremat splits with PyTorch's default_partition, which asserts on a dead
# native_dropout (a tuple-valued node whose getitems were removed): strict raises, non-strict falls back


class DeadDropout(nn.Module):
    """A dropout whose result is unused (DCE keeps it: random ops are impure) next to x * 2, whose backward needs
    nothing.  The fuzzer's case: Program((2, 2, 2), (linear, linear, permute(x), rms_norm, dropout, linear_twice,
    to_bf16(permute)), outputs=(to_bf16,))."""

    def forward(self, x):
        F.dropout(x, 0.1, training=True)
        return x * 2.0


def test_dead_dropout_in_a_graph_without_backward_needs():
    x = torch.randn(3, 4, requires_grad=True)
    result = fxremat_step(DeadDropout(), (x,), lambda out: out.sum(), strict=True)
    torch.testing.assert_close(result.grads["input 0"], torch.full((3, 4), 2.0))
    assert result.reports[0].saved_bytes == 0
