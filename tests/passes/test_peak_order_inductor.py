"""fxremat_passes/simulator/peak_order.py against Inductor's own reordering for peak memory (torch/_inductor/memory.py), run on
the same random kernel graphs: the same estimate, the same three sorts, the same order kept.  A torch release that
changes Inductor's heuristics fails here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxremat_passes import _torch_private as tp
from fxremat_passes.simulator.peak_order import Buffer, OrderProblem, bfs, dfs, estimate_peak, lpmf, reordered

memory = pytest.importorskip("torch._inductor.memory")
from torch.utils._ordered_set import OrderedSet  # noqa: E402


@dataclass(eq=False)
class _Dep:
    name: str


@dataclass(eq=False)
class _Buf:
    """The fields of a ``SchedulerBuffer`` that Inductor's memory functions read."""

    name: str
    mpi_buffer: memory.MemoryPlanningInfoForBuffer = field(default_factory=memory.MemoryPlanningInfoForBuffer)

    def get_name(self) -> str:
        return self.name


@dataclass(eq=False)
class _Node:
    """The fields of a (fused) ``BaseSchedulerNode`` that Inductor's memory functions read."""

    name: str
    outputs: list = field(default_factory=list)
    unmet_dependencies: OrderedSet = field(default_factory=OrderedSet)
    mpi_node: memory.MemoryPlanningInfoForNode | None = None

    def get_name(self) -> str:
        return self.name

    def get_outputs(self) -> list:
        return self.outputs

    def get_buffer_names(self) -> OrderedSet:
        return OrderedSet(b.name for b in self.outputs)


def _buffer_info(size: int, succ: OrderedSet):
    fields = {f.name for f in dataclasses.fields(memory.MemoryPlanningInfoForBuffer)}
    ordering = {"succ_nodes_for_ordering": OrderedSet(succ)} if "succ_nodes_for_ordering" in fields else {}
    return memory.MemoryPlanningInfoForBuffer(size_alloc=size, size_free=size, succ_nodes=succ, **ordering)


def _as_inductor(problem: OrderProblem):
    """(nodes, freeable inputs, buffers by name, output names) for ``problem``, as ``prepare_planning_info`` leaves
    them."""
    nodes = [_Node(f"op{k}") for k in range(problem.size)]
    name_to_buf, freeable, outputs = {}, {}, OrderedSet()
    for i, b in enumerate(problem.buffers):
        succ = OrderedSet(nodes[r] for r in sorted(b.readers))
        info = _buffer_info(b.size, succ)
        if b.producer < 0:
            freeable[f"in{i}"] = memory.FreeableInputBuffer(f"in{i}", info)
            continue
        buf = _Buf(f"buf{i}", info)
        name_to_buf[buf.name] = buf
        nodes[b.producer].outputs.append(buf)
        if b.output:
            outputs.add(buf.name)
    for k, preds in enumerate(problem.preds):
        # an ordering dependency on each predecessor's first buffer (a buffer-less kernel gets one of size 0)
        for p in sorted(preds):
            if not nodes[p].outputs:
                empty = _Buf(f"empty{p}", _buffer_info(0, OrderedSet()))
                name_to_buf[empty.name] = empty
                nodes[p].outputs.append(empty)
            first = nodes[p].outputs[0]
            getattr(first.mpi_buffer, "succ_nodes_for_ordering", OrderedSet()).add(nodes[k])
            nodes[k].unmet_dependencies.add(_Dep(first.name))
    for k, node in enumerate(nodes):
        reads = OrderedSet(
            buf for buf in [*name_to_buf.values(), *freeable.values()] if node in buf.mpi_buffer.succ_nodes
        )
        node.mpi_node = memory.MemoryPlanningInfoForNode(
            index=k,
            size=sum(b.mpi_buffer.size_alloc for b in node.outputs),
            pred_buffers=reads,
            pred_nodes=OrderedSet(nodes[p] for p in sorted(problem.preds[k])),
            succ_nodes=OrderedSet(nodes[j] for j in range(problem.size) if k in problem.preds[j]),
        )
    return nodes, freeable, name_to_buf, outputs


@st.composite
def problems(draw):
    n = draw(st.integers(2, 9))
    preds = tuple(frozenset(draw(st.sets(st.integers(0, k - 1), max_size=3)) if k else ()) for k in range(n))
    succ = [sorted(j for j in range(n) if k in preds[j]) for k in range(n)]
    buffers = []
    for k in range(n):
        for _ in range(draw(st.integers(0, 2))):
            readers = frozenset(draw(st.sets(st.sampled_from(succ[k]), max_size=3))) if succ[k] else frozenset()
            buffers.append(Buffer(draw(st.integers(0, 64)), k, readers, draw(st.booleans())))
    for _ in range(draw(st.integers(0, 2))):
        readers = frozenset(draw(st.sets(st.integers(0, n - 1), min_size=1)))
        buffers.append(Buffer(draw(st.integers(1, 64)), -1, readers))
    return OrderProblem(preds, tuple(buffers), tp.inductor_estimate_counts_outputs())


def _positions(order) -> list[int]:
    return [int(node.name[2:]) for node in order]


@settings(max_examples=300, deadline=None)
@given(problems())
def test_estimate_sorts_and_choice_equal_inductors(problem):
    nodes, freeable, name_to_buf, outputs = _as_inductor(problem)
    assert estimate_peak(problem, list(range(problem.size))) == memory.estimate_peak_memory(nodes, freeable, outputs)[0]
    assert lpmf(problem) == _positions(memory.topological_sort_lpmf(nodes, freeable, name_to_buf, outputs))
    assert bfs(problem) == _positions(memory.topological_sort_bfs(nodes))
    assert dfs(problem) == _positions(memory.topological_sort_dfs(nodes))
    kept = min(
        [nodes, *(memory.topological_sort_lpmf(nodes, freeable, name_to_buf, outputs),),
         memory.topological_sort_bfs(nodes), memory.topological_sort_dfs(nodes)],
        key=lambda order: memory.estimate_peak_memory(order, freeable, outputs)[0],
    )  # reorder_for_peak_memory's choice: the first lowest, the given order first
    assert reordered(problem) == _positions(kept)
