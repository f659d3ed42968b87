"""The simulator's rules for a CPU ``cat`` (Inductor's ConcatKernel), a scatter's result and a reduction over a few
elements (issue #15, Mixtral and GPT-2).

Each test fails without its rule: a ConcatKernel's buffer is stored whatever reads it, Inductor's own memory
estimate counts a cat's bytes twice while its kernel group runs (only where its ConcatKernel node runs in that
group), a scatter's result is never written over the values it scatters, and a reduction over fewer than 8
elements is a pointwise value; a scatter into a value that fuses away is written over that value's input.  Found on
Mixtral's expert backward, a Llama stack's SwiGLU backward and GPT-2's position-embedding gradient
(benchmarks/RESULTS.md, "Issue #15, session 18" and "session 22"), and on GPT-2's tied head (issue #55)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.simulator.inputs import SimulatorInputs
from fxremat_passes.simulator.liveness import simulate_step
from fxremat_passes.simulator.phase import _Phase
from fxremat_passes.simulator.walk import Walk


def _backward_peak(forward, backward, fw_args, bw_args) -> int:
    fw = make_fx(forward, tracing_mode="fake")(*fw_args)
    bw = make_fx(backward, tracing_mode="fake")(*bw_args)
    estimate = simulate_step(fw, bw, 1)
    return max(nbytes for phase, _, nbytes in estimate.timeline if phase == "backward")


def _forward(x):
    return x.sum(), x.sin() + 1


def test_a_cpu_cat_is_stored_even_where_its_readers_would_fuse_it():
    """c = cat(2s, 3s) (16x16 fp32, 1024 B) is read by a sum and a pointwise op, both of which would fuse a
    pointwise value away; on CPU it is a ConcatKernel (torch/_inductor/lowering.py ``cat``: "if cpu_device: return
    TensorBox(ir.ConcatKernel.create(inputs, dim))"), stored before its readers run: s (16x8, 512 B), c and the two
    results (64 + 1024 B) are live at once.  Fused away, c would be 1024 B fewer."""

    def backward(s, tangents_1):
        c = torch.cat([s * 2, s * 3], 1)
        return c.sum(1), c * 4

    x = torch.randn(16, 8)
    assert _backward_peak(_forward, backward, (x,), (x.clone(), torch.tensor(1.0))) == 512 + 1024 + 64 + 1024


def test_inductor_estimate_counts_a_cat_twice_until_its_kernel_group_is_done():
    """The kernels that compute a cat's inputs write into its buffer's slices (``NonOwningLayout``), yet
    ``memory.compute_size_for_scheduler_buffer`` sizes each by its numel: Inductor's estimate, which bounds its
    buffer reuse, holds the cat's 1024 B twice while the cat's kernel group runs (s 512 B, w 1024 B), then once,
    beside the matmul's result, when the matmul has flushed the group.  And the matmul's result is a new buffer:
    a NopKernel's buffer is never written over (``Scheduler.decide_inplace_update``)."""

    def backward(s, w, tangents_1):
        return (torch.mm(torch.cat([s * 2, s * 3], 1), w),)

    x, w = torch.randn(16, 8), torch.randn(16, 16)
    gm = make_fx(backward, tracing_mode="fake")(x, w, torch.tensor(1.0))
    inputs = SimulatorInputs.default("cpu").with_changes(buffer_reuse=tp.ALLOCATED)
    phase = _Phase(gm.graph, keep=set(), carried={"s_1": 512, "w_1": 1024}, inputs=inputs)
    walk = Walk(phase, phase.fusion_order())
    walk.run("backward", [])
    assert walk.estimated == [512 + 1024 + 2 * 1024, 1024 + 1024 + 1024]


def test_a_scatter_is_never_written_over_the_values_it_scatters():
    """index_put of 2s into zeros (16x8 fp32, 512 B): s dies there and has the result's size, but Inductor lowers
    index_put to a realized clone of the zeros that a Scatter mutates (lowering.py ``index_put_impl_``), and
    ``Scheduler.decide_inplace_update`` skips a mutation's output: s (512 B) and a fresh result (512 B).  Mixtral's
    expert weight gradients are such scatters, read from a saved projection of their size."""

    def backward(s, idx, tangents_1):
        return (torch.ops.aten.index_put(torch.zeros(16, 8), [idx], s * 2),)

    x = torch.randn(16, 8)
    idx = torch.arange(16)

    def forward(x, idx):
        return x.sum(), x.sin() + 1, idx

    peak = _backward_peak(forward, backward, (x, idx), (x.clone(), idx, torch.tensor(1.0)))
    assert peak == 512 + 512  # idx is a forward input: not counted


def test_a_reduction_over_few_elements_is_a_pointwise_value():
    """s = sum over a batch of 2 (16x8 fp32, 512 B) read only by a scatter: Inductor unrolls a reduction over fewer
    than ``config.unroll_reductions_threshold`` (8) elements into a pointwise sum (torch/_inductor/ir.py
    ``Reduction.create`` returns a ``Pointwise``), which the scatter loads inside its loop: no buffer.  g (1024 B)
    and the result (512 B) only; stored, s would add 512 B.  GPT-2's position-embedding gradient (batch 2)."""

    def forward(x, idx):
        return x.sum(), x.sin() + 1, idx

    def backward(g, idx, tangents_1):
        s = (g * 2).sum(0)
        return (torch.ops.aten.index_put(torch.zeros(16, 8), [idx], s, True),)

    x, idx = torch.randn(2, 16, 8), torch.arange(16)
    assert _backward_peak(forward, backward, (x, idx), (x.clone(), idx, torch.tensor(1.0))) == 1024 + 512


class _Kernels:
    """What ``Walk.cat_placed_in_group`` reads of a phase: the units' graph order and each kernel's units."""

    def __init__(self, kernels: list[list[str]], generated: set[str]) -> None:
        names = [n for kernel in kernels for n in kernel]
        self.index = {n: i for i, n in enumerate(sorted(names, key=lambda n: int(n[1:])))}
        self.kernels = {kernel[0]: kernel for kernel in kernels}
        self.generated = generated


def _placed(kernels: list[list[str]], generated: set[str], k: int, cat: str) -> bool:
    walk = Walk.__new__(Walk)  # only the order, the kernels and what is grouped
    walk.phase = _Kernels(kernels, generated)
    walk.order = [kernel[0] for kernel in kernels]
    walk.grouped = lambda j: j < len(walk.order) and walk.order[j] in generated
    return walk.cat_placed_in_group(k, cat)


def test_a_cat_is_counted_twice_only_where_its_concat_kernel_runs_in_the_slices_group():
    """Inductor's estimate counts a ConcatKernel's buffer at its own scheduler node, placed after every node lowered
    before it (``Scheduler.fuse_nodes_once`` sorts by ``min_order``).  Llama's recomputed SwiGLU backward: the kernel
    writing the gradient's slices (n5, with the product n2 and the cat n6) runs after the extern ``mm`` n4, and the
    down projection's weight gradient ``mm`` n3 (lowered before the cat, reading n2) after it: the group is flushed,
    its slices freed, before the ConcatKernel's node, so the cat is not counted twice.  With no extern kernel
    between them it is (Mixtral's expert backward, session 18)."""
    flushed = [["n1"], ["n4"], ["n2", "n5", "n6"], ["n3"], ["n7"]]
    assert not _placed(flushed, {"n1", "n2", "n7"}, 2, "n6")
    assert _placed(flushed, {"n1", "n2", "n3", "n7"}, 2, "n6")  # were n3 generated code, nothing flushes
    assert _placed([["n1"], ["n2", "n5", "n6"], ["n7"]], {"n1", "n2", "n7"}, 1, "n6")


def test_a_scatter_into_a_value_that_fuses_away_is_written_over_its_input():
    """index_put accumulating v (4x8 fp32, 128 B) into 2s (16x8, 512 B): 2s fuses into the clone's loop, which
    Inductor writes over s, dying there with the clone's size (a tied LM head's gradient scaled in backward, the
    embedding's scatter added into it, docs/DESIGN.md §14): s and v, no fresh result."""

    def backward(s, v, idx, tangents_1):
        return (torch.ops.aten.index_put(s * 2, [idx], v, True),)

    x, v, idx = torch.randn(16, 8), torch.randn(4, 8), torch.arange(4)

    def forward(x, v, idx):
        return x.sum(), x.sin() + 1, v * 1, idx

    peak = _backward_peak(forward, backward, (x, v, idx), (x.clone(), v.clone(), idx, torch.tensor(1.0)))
    assert peak == 512 + 128
