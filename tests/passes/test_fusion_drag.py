"""The simulator's side of the fusion veto (``fusion.Fusion.dragged_bytes``, ``fusion.drags_too_much``): what a
fusion of an early kernel with a late one would run early, in the units' own terms (docs/DESIGN.md §6)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes.simulator.backends.cpp_fusion import CppFusionVetoes
from fxremat_passes.simulator.fusion import DRAG_FACTOR, HORIZONTAL_DRAG_FACTOR, Fusion, drags_too_much


def _fusion_of(fn, *inputs, segmented: bool = False) -> tuple[Fusion, dict]:
    """A ``Fusion`` whose units are the graph's computations, each reading its node arguments."""
    graph = make_fx(fn)(*inputs).graph
    units = [n for n in graph.nodes if n.op == "call_function"]
    unit = {u: u for u in units}
    reads = {u: {a for a in u.all_input_nodes} for u in units}
    index = {n: i for i, n in enumerate(graph.nodes)}
    return Fusion(units, reads, unit, index, access={}, segmented=segmented), {u.name: u for u in units}


def _nbytes(node) -> int:
    val = node.meta["val"]
    return val.numel() * val.element_size()


def test_fusing_an_early_sum_with_a_late_reader_drags_the_work_between():
    def sums(x, y, w):
        early = x.sum(0)  # small, ready at once
        late = torch.mm(y, w).relu().sum(0)  # a matmul and a large relu before it
        return early + late

    fusion, node = _fusion_of(sums, torch.randn(64, 16), torch.randn(64, 32), torch.randn(32, 16))
    mm, relu, late = node["mm"], node["relu"], node["sum_2"]
    dragged = fusion.dragged_bytes(node["sum_1"], node["add"], _nbytes)
    assert dragged == _nbytes(mm) + _nbytes(relu) + _nbytes(late)
    assert drags_too_much(dragged, shared_bytes=_nbytes(node["sum_1"]))  # 16 floats shared, 8 KiB moved
    # the late sum with its own reader drags nothing: everything it needs already ran before it
    assert fusion.dragged_bytes(late, node["add"], _nbytes) == 0
    # nor do two sums neither of which reads the other (a horizontal fusion: never refused)
    assert fusion.dragged_bytes(node["sum_1"], late, _nbytes) == 0


def test_a_segmented_backward_refuses_a_horizontal_fusion_dragging_much_more_than_it_shares():
    """Two readers of ``x``, the later also reading a matmul and three pointwise ops placed between them: fused,
    those run at the first reader's place.  Left alone elsewhere (Inductor's 64-node limit bounds those); refused
    where the backward is recomputed segment by segment, where it would run a later segment's recompute early."""

    def two_readers(x, y, w):
        early = x.sum(0)
        late = (x * torch.mm(y, w).relu().exp().sin()).sum(0)
        return early + late

    inputs = torch.randn(64, 16), torch.randn(64, 32), torch.randn(32, 16)
    for segmented in (False, True):
        fusion, node = _fusion_of(two_readers, *inputs, segmented=segmented)
        early, late, shared = node["sum_1"], node["sum_2"], _nbytes(node["sum_1"].args[0])
        assert fusion.dragged_bytes(early, late, _nbytes) == 0  # horizontal
        dragged = fusion.dragged_bytes(early, late, _nbytes, horizontal=True)
        assert dragged == sum(_nbytes(node[n]) for n in ("mm", "relu", "exp", "sin", "mul")) == 5 * shared
        assert fusion.refused(early, late, shared, _nbytes) is segmented
        # dragging no more than HORIZONTAL_DRAG_FACTOR times what it shares: fused
        assert not fusion.refused(early, late, dragged // HORIZONTAL_DRAG_FACTOR, _nbytes)


def test_a_fusion_saving_enough_traffic_is_never_refused():
    assert not drags_too_much(DRAG_FACTOR * 1000, 1000)
    assert drags_too_much(DRAG_FACTOR * 1000 + 1, 1000)
    assert not drags_too_much(0, 0)


def test_the_inductor_side_of_the_veto_never_fails_a_compile():
    """A scheduler node that does not look as the veto expects (a future Inductor) leaves Inductor's own decision."""
    from fxremat_passes._torch_private import scheduler as hooks

    class Changed:
        def __init__(self, order: int) -> None:
            self.min_order = order

        def get_name(self) -> str:
            return f"op{self.min_order}"

        def get_operation_names(self):
            raise AttributeError("renamed in a later torch")

    assert hooks._drags_too_much(object(), Changed(0), Changed(9)) is False


def _kernels(fn, inputs, reduces) -> list[set[str]]:
    """The kernels ``Fusion.fuse`` makes of the graph's computations, every one a kernel of one loop size, each
    reading its arguments at the same index; ``reduces``: the names of the C++ reductions (None: no backend vetoes,
    ``backends/cpp_fusion.py``)."""
    from fxremat_passes.graph.ops import OpClass

    fusion, node = _fusion_of(fn, *inputs)
    fusion.access = {u: {a: frozenset({()}) for a in u.all_input_nodes} for u in node.values()}
    classes = {u: OpClass.POINTWISE for u in node.values()}

    def vetoes(fusible):  # the C++ backend's over the named reductions, no loop sizes known
        return CppFusionVetoes({u for u in fusible if u.name in reduces}, {})

    kernels = fusion.fuse(classes, lambda u: "one loop", _nbytes, None if reduces is None else vetoes)
    return sorted(({u.name for u in members} for members in kernels.values()), key=sorted)


def test_cpu_never_fuses_a_reduction_with_a_later_pointwise_kernel_beside_it():
    """Inductor's C++ backend fuses two kernels that share a read and neither reads the other only where the
    earlier is not a reduction (``CppScheduling._why_fuse_nodes``).  Mixtral's one-column input-gradient ``bmm``
    (a sum) and the later weight-gradient scatter of the same output gradient run apart."""

    def reduction_first(x):
        return x.sum(1), x * 2

    def pointwise_first(x):
        return x * 2, x.sum(1)

    x = torch.randn(64, 16)
    assert _kernels(reduction_first, (x,), reduces=None) == [{"sum_1", "mul"}]
    assert _kernels(reduction_first, (x,), reduces={"sum_1"}) == [{"mul"}, {"sum_1"}]
    assert _kernels(pointwise_first, (x,), reduces={"sum_1"}) == [{"mul", "sum_1"}]


def test_a_path_through_a_group_that_spans_far_is_a_cycle():
    """``a``, ``w1``, ``b`` (reads ``w1``), ``x`` (reads ``a``), ``y`` (reads ``x``), ``w2`` (reads ``y``), with
    ``w1`` and ``w2`` already one kernel (as a segmented backward's recompute and its second pass's): fusing ``a``
    with ``b`` would make a -> x -> y -> {w1, w2} -> b a cycle, though ``x`` and ``y`` come after ``b``."""
    graph = torch.fx.Graph()
    inp = graph.placeholder("inp")
    a = graph.call_function(torch.ops.aten.relu.default, (inp,))
    w1 = graph.call_function(torch.ops.aten.neg.default, (inp,))
    b = graph.call_function(torch.ops.aten.exp.default, (w1,))
    x = graph.call_function(torch.ops.aten.sin.default, (a,))
    y = graph.call_function(torch.ops.aten.tan.default, (x,))
    w2 = graph.call_function(torch.ops.aten.cos.default, (y,))
    graph.output((b, w2))
    units = [a, w1, b, x, y, w2]
    reads = {u: set(u.all_input_nodes) for u in units}
    fusion = Fusion(units, reads, {u: u for u in units}, {n: i for i, n in enumerate(graph.nodes)}, access={})
    assert not fusion.creates_cycle(a, b)  # before w1 and w2 are one kernel, nothing joins the two paths
    fusion.merge(w1, w2)
    assert fusion.creates_cycle(a, b)
