"""A stored value and a reduction that reads it at another index than it is written at (``access.another_index``):
Inductor never fuses the two (``Scheduler.can_fuse_vertical``, ``score_fusion_memory``), so the value's buffer
exists while that reduction runs (issue #15's "the simulator must see every plan it may choose"; RESULTS.md
"Session 25")."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes.simulator import access
from fxremat_passes.simulator.liveness import _Phase


def _nbytes(node) -> int:
    val = node.meta["val"]
    return val.numel() * val.element_size()


def _gather_two_bmms(w, idx, x, g):
    """Mixtral's batched_mm experts, reduced: a gather of expert weights read by two one-row bmms (each a multiply
    and a sum on CPU).  The first reads the weights as its second operand (a sum over their rows: out of order), the
    second through a transpose as the same operand (a sum over their columns: in order).  Read twice, one reader a
    bmm, the gather is stored (``GraphLowering.run_node`` -> ``realize_hint``)."""
    selected = w[idx]
    return torch.bmm(x.unsqueeze(1), selected), torch.bmm(g.unsqueeze(1), selected.permute(0, 2, 1))


_ARGS = (torch.randn(3, 64, 16), torch.randint(0, 3, (32,)), torch.randn(32, 64), torch.randn(32, 16))


def _phase(fn, *args) -> tuple[_Phase, dict]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return _Phase(gm.graph, keep=set(), carried={}), {n.name: n for n in gm.graph.nodes}


def _kernels(phase: _Phase) -> list[list[str]]:
    return sorted(sorted(u.name for u in units) for units in phase.kernels.values())


def test_a_stored_gather_fuses_only_into_the_bmm_reading_it_in_its_order():
    phase, node = _phase(_gather_two_bmms, *_ARGS)
    gather, by_rows, by_columns = node["index"], node["bmm"], node["bmm_1"]
    assert phase.unit[gather] is gather  # the premise: stored
    assert set(phase.access[by_rows][gather]) == {(access.another_index(by_rows)[gather],)}
    assert not any(map(access.at_another_index, phase.access[by_columns][gather]))
    assert not any({"index", "bmm"} <= set(kernel) for kernel in _kernels(phase)), _kernels(phase)
    peak = phase.run("forward", [])
    assert peak >= _nbytes(gather)  # fused into both readers, it was never allocated


def test_a_sum_over_a_transposed_stored_value_runs_in_a_kernel_of_its_own():
    """sigmoid(a) read twice is stored on CPU (``StorageBox.should_realize_on_reuse``); ``2 * s`` reads it at its
    index and fuses with it; the sum over its rows (``s.t()`` summed over its last dimension) does not."""

    def f(a):
        s = torch.sigmoid(a)
        return s * 2, s.t().sum(-1)

    phase, node = _phase(f, torch.randn(64, 32))
    assert phase.unit[node["sigmoid"]] is node["sigmoid"]
    assert not any({"sigmoid", "sum_1"} <= set(kernel) for kernel in _kernels(phase)), _kernels(phase)


def test_the_rule_switched_off_fuses_as_before(monkeypatch):
    monkeypatch.setattr(access, "VERTICAL_INDEX_RULE", False)
    phase, node = _phase(_gather_two_bmms, *_ARGS)
    assert _kernels(phase) == [["bmm", "bmm_1", "index"]], _kernels(phase)
    assert phase.run("forward", []) < _nbytes(node["index"])


@pytest.mark.inductor
def test_inductor_stores_the_gather_and_fuses_it_into_no_bmm_reading_it_out_of_order():
    """Real Inductor on the same function: the gather's buffer is allocated (``TORCH_LOGS=+fusion``: "cannot fuse
    op0 with op1: no shared data", op1 the bmm reading it out of order).  It fuses into the other bmm neither: on
    CPU a pointwise loop over [32, 64, 16], merged to one range, is not the reduction's (2048, 16)
    (``CppScheduling._why_fuse_nodes``), which the simulator models for one-input reductions only (``cpu_loops.py``:
    a ``bmm`` is two); its peak is the same either way."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, (code,) = run_and_get_code(torch.compile(_gather_two_bmms, backend="inductor"), *_ARGS)
    gathered = (_ARGS[1].numel(), *_ARGS[0].shape[1:])
    assert "empty_strided_cpu(({}, {}, {})".format(*gathered) in code, code


def test_the_memoised_layouts_give_every_read_the_unmemoised_step():
    """``NodeFacts`` keeps each node's ``access.layout`` (a root read by many nodes is laid out once): every read's
    step through the memo is ``access.step``'s own, on a graph of slices, transposes, reshapes and broadcasts."""
    from fxremat_passes.graph.costs import alias_root

    def f(a, b):
        t = a.t().contiguous()
        return (a[:, 8:] * 2).sum(0), (t.reshape(-1) + 1).view(16, 32), a + b.unsqueeze(0), a.permute(1, 0).sum(1)

    phase, _ = _phase(f, torch.randn(32, 16), torch.randn(16))
    reads = [(arg, alias_root(arg)) for n in phase.nodes for arg in n.all_input_nodes if "val" in arg.meta]
    assert len({access.step(arg, root) for arg, root in reads}) > 1  # the graph reads through more than one layout
    for arg, root in reads:
        assert phase.facts.access_step(arg, root) == access.step(arg, root)
        assert phase.facts._layout[arg] == access.layout(arg)
