"""A pointwise loop fuses with a row reduction on CPU only where its simplified sizes are the reduction's loop and
reduction sizes side by side (``cpp_loops.py``, ``cpp_fusion.CppFusionVetoes.loops_differ``; benchmarks/RESULTS.md,
session 33: ViT's recomputed residual stream, a sum of blocks' outputs and a position table broadcast over the
batch)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes.simulator.backends import cpp_loops as cpu_loops
from fxremat_passes.simulator.liveness import _Phase

B, S, D = 2, 12, 32


def _with_position_table(x, pos):
    """sigmoid(x + pos) is read twice and costly, so stored (``StorageBox.should_realize_on_reuse``); its loop reads
    ``pos`` broadcast over the batch: sizes (B, S * D), where the row sums run as (B * S,) + (D,)."""
    h = torch.sigmoid(x + pos)
    return h * 2, h.sum(-1)


def _with_a_weight(x, w):
    """The same with a weight broadcast over the rows: sizes (B * S, D), the reduction's side by side."""
    h = torch.sigmoid(x * w)
    return h * 2, h.sum(-1)


def _contiguous(x, y):
    """Every read laid out as the output: one dim of B * S * D."""
    h = torch.sigmoid(x + y)
    return h * 2, h.sum(-1)


CASES = {
    "position table": (_with_position_table, (torch.randn(B, S, D), torch.randn(1, S, D)), False),
    "weight": (_with_a_weight, (torch.randn(B, S, D), torch.randn(D)), True),
    "contiguous": (_contiguous, (torch.randn(B, S, D), torch.randn(B, S, D)), False),
}


def _phase(fn, *args) -> tuple[_Phase, dict]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return _Phase(gm.graph, keep=set(), carried={}), {n.name: n for n in gm.graph.nodes}


def test_merged_sizes_follow_every_read():
    loop = [B, S, D]
    contiguous = cpu_loops._contiguous(loop)
    assert cpu_loops._merged(loop, [contiguous]) == (B * S * D,)
    assert cpu_loops._merged(loop, [contiguous, [0, 0, 1]]) == (B * S, D)  # a weight
    assert cpu_loops._merged(loop, [contiguous, [S, 1, 0]]) == (B * S, D)  # per-row statistics
    assert cpu_loops._merged(loop, [contiguous, [0, D, 1]]) == (B, S * D)  # a position table
    assert cpu_loops._merged([B, 1, D], [[D, D, 1]]) == (B * D,)  # a size-1 dim is dropped
    blocked = [cpu_loops.BLOCKED] * 3  # a read whose dims do not line up with the loop's (a select_scatter)
    assert cpu_loops._merged(loop, [contiguous, blocked]) == (B, S, D)
    assert cpu_loops._read_strides(_value(torch.randn(B, D)), loop, B * D) == blocked
    assert cpu_loops._read_strides(_value(torch.randn(S, 1)), loop, S) == [0, 1, 0]


def _value(t: torch.Tensor):
    """A graph node holding ``t`` as its value (what ``cpu_loops`` reads of a storage)."""
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["val"] = t
    return node


def test_a_concat_kernel_fuses_with_no_reader_of_it():
    """On CPU a ``cat`` is a ``ConcatKernel``, a NopKernel between the kernels writing its slices and those reading
    it (``cpu_loops.NO_LOOP``): the pointwise-and-sum and the add that read it run in kernels of their own."""

    def f(a, b):
        c = torch.cat([a, b], 1)
        return (c * 2).sum(-1), c + 1

    phase, node = _phase(f, torch.randn(B, S, D), torch.randn(B, 1, D))
    cat = node["cat"]
    assert cpu_loops.loop_sizes(phase, cat) is cpu_loops.NO_LOOP
    assert [units for units in phase.kernels.values() if cat in units] == [[cat]], phase.kernels


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_simulated_kernels_fuse_a_stored_pointwise_with_the_row_sum_only_where_sizes_match(case):
    fn, args, fused = CASES[case]
    phase, node = _phase(fn, *args)
    h, total = node["sigmoid"], node["sum_1"]
    assert phase.unit[h] is h  # the premise: stored
    sizes = cpu_loops.loop_sizes(phase, h)
    assert sizes is not None and sizes[1] == ()
    assert cpu_loops.loop_sizes(phase, total) == ((B * S,), (D,))
    together = any({h, total} <= set(units) for units in phase.kernels.values())
    assert together is fused, (sizes, phase.kernels)


@pytest.mark.inductor
@pytest.mark.parametrize("case", sorted(CASES))
def test_inductor_fuses_them_as_the_simulation_does(case):
    """Real Inductor on each function: the sum runs in the sigmoid's loop nest exactly where the simulation fuses
    them, and then the sigmoid's value needs no buffer (one [B, S, D] buffer, for ``h * 2``, against two).  On CPU
    both loop nests sit in one C++ function either way (a kernel group), so the function count says nothing."""
    from torch._inductor.utils import run_and_get_code

    fn, args, fused = CASES[case]
    torch._dynamo.reset()
    _, (code,) = run_and_get_code(torch.compile(fn, backend="inductor"), *args)
    buffers = code.count(f"empty_strided_cpu(({B}, {S}, {D})")
    assert buffers == (1 if fused else 2), code
