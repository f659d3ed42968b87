"""Fuzzing the partition: random small modules (fuzz_models.py) through aot_module with fxremat's partitioner at
several budgets and prices, strict (an internal failure is an error, not a silent fallback), against eager.

Models with dropout are compared with PyTorch's default partitioner through the same aot_module path, under the
same seed: both run the forward graph's one functional RNG op per dropout, in graph order, so the masks agree.

CI runs a fixed, derandomized set of cases.  ``FXREMAT_FUZZ_LONG=1`` (or ``pytest --long``, which sets it) runs
thousands of fresh random cases; ``FXREMAT_FUZZ_EXAMPLES=N`` sets the count.  A failure found there becomes a
concrete module in test_regressions.py.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from fuzz_models import FuzzModel, Program, Step, fresh, loss_of, make_inputs, programs
from hypothesis import HealthCheck, example, given, settings
from robust_helpers import (
    BF16_RTOL,
    FP32_RTOL,
    aot_step,
    assert_steps_match,
    eager_step,
    fxremat_step,
    pytorch_default_partition,
)

from fxremat import FxrematBudgetWarning

LONG = os.environ.get("FXREMAT_FUZZ_LONG") == "1"
EXAMPLES = int(os.environ.get("FXREMAT_FUZZ_EXAMPLES", 2000 if LONG else 25))

# Every budget and price the plan code distinguishes: the default cut, a Lagrangian search plus MILP refinement,
# the fewest-bytes cut, and the two extremes of the price.
CONFIGS = {
    "budget None": dict(memory_budget=None),
    "budget 0.5": dict(memory_budget=0.5),
    "budget 0.0": dict(memory_budget=0.0),
    "price 0": dict(memory_price=0.0),
    "price 1e6": dict(memory_price=1e6),
}

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=not LONG,  # CI: the same cases every run; long mode: fresh ones (and hypothesis's database)
    database=None if not LONG else settings.default.database,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


def check_program(program: Program) -> None:
    torch.manual_seed(0)
    model = FuzzModel(program)
    inputs = make_inputs(program)
    rtol = BF16_RTOL if program.touches_bf16 else FP32_RTOL
    if program.has_dropout:
        torch.manual_seed(1)
        reference = aot_step(model, fresh(inputs), pytorch_default_partition, loss_of)
    else:
        reference = eager_step(model, fresh(inputs), loss_of)
    reports = {}
    for label, config in CONFIGS.items():
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FxrematBudgetWarning)  # random ops can make 0.5 unreachable
            result = fxremat_step(model, fresh(inputs), loss_of, strict=True, compare_default=False, **config)
        assert_steps_match(result, reference, rtol, label)
        # No joint graph at all when no output needs a gradient through the graph (an output that is the input).
        assert len(result.reports) <= 1
        for report in result.reports:
            assert report.fallback_reason is None
            # One definition of saved bytes: the plan's figure is what autograd keeps (measured apart).
            assert report.saved_bytes == result.saved.nbytes, (label, report.saved_bytes, result.saved.nbytes)
            reports[label] = report
    if reports and reports["budget 0.0"].budget_bytes is not None:  # None: backward needs nothing, no plan
        check_budget_invariants(reports)


def check_budget_invariants(reports: dict) -> None:
    default, half, zero = reports["budget None"], reports["budget 0.5"], reports["budget 0.0"]
    assert zero.budget_met and zero.saved_bytes == zero.fewest_saved_bytes
    if half.budget_met:
        assert half.saved_bytes <= half.budget_bytes
    assert zero.saved_bytes <= half.saved_bytes <= default.saved_bytes, (zero, half, default)
    # Price 1e6 (in memory_price units) is the price the budget code uses for the fewest-bytes plan; without a budget
    # the default may not recompute a compute-bound kernel (docs/DESIGN.md §4.5), so it keeps at least those bytes
    assert reports["price 1e6"].saved_bytes >= zero.fewest_saved_bytes
    assert reports["price 0"].saved_bytes >= default.saved_bytes


# Two dense programs that always run (hypothesis's explicit phase): CI's few random cases are mostly short, and
# these cover the rest of the menu (convs, BatchNorm, in-place ops on activations and on a slice, a mutated input,
# split, amax broadcast, gather, embedding, bf16 both ways, dropout next to a cat of its own input).
RICH_CONV = Program(
    input_shape=(2, 3, 4, 4),
    steps=(
        Step("conv2d", (0,), (3, 4, 3, True)),
        Step("batch_norm", (1,), (4, 4)),
        Step("act", (2,), ("silu",)),
        Step("inplace", (3,), ("mul_",)),
        Step("split", (3,), (1, 2, True)),
        Step("binary", (4, 5), ("mul",)),
        Step("reduce", (6,), ("amax", 3, True)),
        Step("binary", (6, 7), ("add",)),
        Step("reshape", (8,), (2, 2, 16)),
        Step("conv1d", (9,), (2, 4, 3, False)),
        Step("dropout", (10,), (0.1,)),
        Step("cat", (11, 10), (1,)),
        Step("softmax", (12,), (2, True)),
    ),
    outputs=(13, 7, 2),
    aux=True,
)
RICH_SEQUENCE = Program(
    input_shape=(2, 5, 6),
    steps=(
        Step("linear", (0,), (6, 8, True)),
        Step("inplace", (1,), ("relu_",)),
        Step("layer_norm", (1,), (8,)),
        Step("to_bf16", (2,)),
        Step("linear_twice", (3,), (8,)),
        Step("inplace", (4,), ("slice_mul_", 1)),
        Step("transpose", (4,), (1, 2)),
        Step("matmul_self", (5,)),
        Step("to_f32", (6,)),
        Step("rms_norm", (7,), (8, True)),
        Step("embedding", (), (10, 8)),
        Step("gather", (9,), (1, (2, 3, 8), 5, 7)),
        Step("index", (8,), (0, (1, 0, 1), True)),
        Step("permute", (11,), (2, 0, 1)),
        Step("slice", (12,), (1, 0, 2)),
        Step("reduce", (13,), ("mean", 1, False)),
        Step("act", (14,), ("tanh",)),
        Step("scale", (15,)),
    ),
    outputs=(16, 10, 4),
    ids=True,
    unused=True,
)


@FUZZ_SETTINGS
@example(RICH_CONV)
@example(RICH_SEQUENCE)
@given(programs())
def test_random_models_match_the_reference(program):
    check_program(program)


BF16_MENU = tuple(
    "to_bf16 to_f32 linear conv1d conv2d layer_norm rms_norm softmax act inplace reshape permute binary reduce".split()
)


@FUZZ_SETTINGS
@given(programs(dropout=False, ops=BF16_MENU))
def test_random_bf16_models_match_eager(program):
    """Mixed precision gets its own run so that CI's few cases always include casts both ways."""
    check_program(program)


@pytest.mark.parametrize("seed", range(2))
def test_fuzz_harness_catches_a_wrong_gradient(seed):
    """The comparison is not vacuous: a gradient scaled by 1.01 fails it."""
    program = Program((2, 3, 4), (Step("linear", (0,), (4, 8, True)),), (1,))
    model, inputs = FuzzModel(program), make_inputs(program, seed)
    expected = eager_step(model, fresh(inputs), loss_of)
    actual = eager_step(model, fresh(inputs), lambda out: loss_of(out) * 1.01)
    with pytest.raises(AssertionError, match="param layers.s0.weight"):
        assert_steps_match(actual, expected, FP32_RTOL)
