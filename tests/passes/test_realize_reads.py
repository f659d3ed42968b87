"""The simulator counts a fused-away value's reads as Inductor does when it decides to store a value read twice
(``config.realize_reads_threshold``, 4): one read per storage *and index* (``Loops.num_reads`` in
torch/_inductor/ir.py counts its loader's distinct ``load(name, index)`` calls), an unrolled reduction's once per
element.  Found on Mixtral at ``memory_budget=0.2``: the residual after layer 0's experts reads 3 storages and is
stored by Inductor, 5 reads (benchmarks/RESULTS.md, issue #15 session 23).  Each test fails counting storages."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes.simulator.phase import _Phase


def _stored(backward, args, carried) -> set[str]:
    """The nodes of ``backward`` the simulator stores (its units), given its placeholders' bytes."""
    gm = make_fx(backward, tracing_mode="fake")(*args, torch.tensor(1.0))
    phase = _Phase(gm.graph, keep=set(), carried=carried)
    return {n.name for n in phase.units}


def test_an_unrolled_sum_loads_its_inputs_once_per_element():
    """v = a + (b * w).sum(1), the sum over 2 elements unrolled into a pointwise value (Inductor's
    ``Reduction._unroll_reduction_fn``): a once, b and w at two indices each, 5 reads > 4, so v, read by two
    nodes, is stored (3 storages: fused into each reader if storages were counted).  Mixtral's top-2 expert sum.
    And a + b.sum(1) + c, 4 reads, is not: every storage is not simply counted once per element.  Both as real
    Inductor does on CPU (torch 2.13: output code of each function compiled, v a buffer of its own in the first)."""

    def backward(a, b, w, tangents_1):
        v = a + (b * w).sum(1)
        return v.sum(0), v * 2

    args = (torch.randn(16, 32), torch.randn(16, 2, 32), torch.randn(16, 2, 1))
    stored = _stored(backward, args, {"a_1": 2048, "b_1": 4096, "w_1": 128})
    assert "add" in stored
    assert "sum_1" not in stored and "mul" not in stored  # the unrolled sum itself stays fused into v

    def four_reads(a, b, c, tangents_1):
        v = a + b.sum(1) + c  # a and c once, b at two indices: not past the threshold, fused into both readers
        return v.sum(0), v * 2

    args = (torch.randn(16, 32), torch.randn(16, 2, 32), torch.randn(16, 32))
    stored = _stored(four_reads, args, {"a_1": 2048, "b_1": 4096, "c_1": 2048})
    assert stored.isdisjoint({"sum_1", "add", "add_1"})


def test_mixtral_top2_sum_with_weights_normalised_by_their_own_sum():
    """Mixtral's residual after its experts: v = a + sum over k of b[2t + k] * w[t, k] / (w[t, 0] + w[t, 1]), both
    sums unrolled.  Inductor loads a once, b at two indices, w at the two the inner and the outer sum share: 5 reads,
    stored.  And u = a + (w / w.sum(-1)).sum(1) + c, w at the same two indices: 4 reads, not stored (an inner
    sum's loads are not multiplied by an outer one's elements: 6 reads of w would store it).  Both as real Inductor
    does on CPU (torch 2.13, output code: v a buffer of its own, u none)."""

    def backward(a, b, w, tangents_1):
        v = a + (b * (w / w.sum(-1, keepdim=True)).reshape(-1, 1)).view(16, 2, 32).sum(1)
        return v.sum(0), v * 2

    args = (torch.randn(16, 32), torch.randn(32, 32), torch.rand(16, 2) + 1)
    stored = _stored(backward, args, {"a_1": 2048, "b_1": 4096, "w_1": 128})
    assert "add" in stored

    def nested(a, w, c, tangents_1):
        u = a + (w / w.sum(-1, keepdim=True)).sum(1, keepdim=True) + c
        return u.sum(0), u * 2

    args = (torch.randn(16, 32), torch.rand(16, 2) + 1, torch.randn(16, 32))
    stored = _stored(nested, args, {"a_1": 2048, "w_1": 128, "c_1": 2048})
    assert stored.isdisjoint({"add", "add_1"})


def test_one_storage_read_at_three_offsets_is_three_reads():
    """v = x[:, :32] + x[:, 32:64] + x[:, 64:] + y + z: 3 storages, 5 reads (x at three indices), stored (as real
    Inductor does)."""

    def backward(x, y, z, tangents_1):
        v = x[:, :32] + x[:, 32:64] + x[:, 64:] + y + z
        return v.sum(0), v * 2

    args = (torch.randn(16, 96), torch.randn(16, 32), torch.randn(16, 32))
    assert "add_3" in _stored(backward, args, {"x_1": 6144, "y_1": 2048, "z_1": 2048})
