"""Minimum s-t cut over a node-split flow network of plain integers.

What the network encodes (docs/DESIGN.md §2). Every value ``v`` of the forward part of the joint graph becomes
two vertices ``v_in -> v_out``:

* ``v_in -> v_out`` has capacity ``save_cost[v]``: cutting it means *save v for backward*;
* ``source -> v_in`` has capacity ``recompute_cost[v]``: cutting it means *compute v in backward*;
* a data edge ``u -> w`` becomes ``u_out -> w_in`` with infinite capacity (a value computed in backward needs
  its inputs in backward, saved or computed there too);
* a value that backward reads gets ``v_out -> sink`` with infinite capacity.

``None`` is an infinite capacity (cannot be saved / cannot be recomputed).  A finite cut is a valid plan whose
value is ``sum(save_cost of saved) + sum(recompute_cost of recomputed)``.

Algorithm: scipy's Dinic (``scipy.sparse.csgraph.maximum_flow``, C), then the source side is read as the set of
vertices reachable from the source in the residual graph, which makes the plan deterministic under ties: the
smallest source side, i.e. among equal-cost plans the one that computes the most in backward... except where a
zero-cost edge lets a value stay on the sink side, which the demand walk below then drops if nobody needs it.

Why not networkx: on the same random 40k-vertex DAG networkx's ``minimum_cut`` took 6.7 s against scipy's 1.7 s
(measured when the solver was chosen), and networkx's running time varied ~60x with the capacity range.  scipy takes
**int32** capacities and silently truncates larger ones, so capacities are bounded here (``CAPACITY_LIMIT``) and
checked.

Tested against networkx and brute force in ``tests/solver``.  This module never imports torch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scipy.sparse import csr_array

# scipy is imported by the first solve, not with this module (here, milp.py and peak_milp.py): a compile that
# Inductor's cache answers never partitions, and should not pay scipy's import (docs/DESIGN.md §8, warm compiles).

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
# The sum of all finite capacities must stay below this, so that "infinity" (that sum + 1) fits in int32.
CAPACITY_LIMIT = 2**30

SOURCE = 0
SINK = 1


def v_in(i: int) -> int:
    return 2 + 2 * i


def v_out(i: int) -> int:
    return 3 + 2 * i


class InfeasibleCutError(ValueError):
    """No finite cut exists: some value backward needs can be neither saved nor recomputed."""

    def __init__(self, message: str, path: tuple[int, ...]):
        super().__init__(message)
        self.path = path  # value indices along an infinite-capacity path from source to sink


@dataclass(frozen=True)
class CutProblem:
    """A framework-free cut problem: values ``0..num_values-1`` and integer costs.

    ``save_cost[v]`` / ``recompute_cost[v]``: non-negative ints, or ``None`` for "impossible" (infinite).
    ``edges``: data dependencies ``(u, w)``: ``w`` reads ``u``.
    ``needed``: the values that backward reads directly.
    """

    num_values: int
    save_cost: tuple[int | None, ...]
    recompute_cost: tuple[int | None, ...]
    edges: tuple[tuple[int, int], ...]
    needed: tuple[int, ...]

    def __post_init__(self) -> None:
        n = self.num_values
        if len(self.save_cost) != n or len(self.recompute_cost) != n:
            raise ValueError("save_cost and recompute_cost need one entry per value")
        if "cost_arrays" not in self.__dict__:  # given by ``of_arrays``, already checked
            self.cost_arrays  # validates the costs
        u, w, needed = _structure(self.edges, self.needed)
        bad = (u < 0) | (u >= n) | (w < 0) | (w >= n) | (u == w)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"bad edge {self.edges[i]} for {n} values")
        bad_needed = (needed < 0) | (needed >= n)
        if bad_needed.any():
            raise ValueError(f"needed value {self.needed[int(np.flatnonzero(bad_needed)[0])]} out of range")

    @classmethod
    def of_arrays(cls, save: np.ndarray, recompute: np.ndarray, edges, needed) -> CutProblem:
        """The problem whose costs are these int64 arrays (``INFINITE`` for None), as ``ParametricProblem.at`` makes
        them: the tuples are read off the arrays, where the constructor builds the arrays from the tuples (at 48
        blocks, 87 solves a ``memory_budget`` partition: that was half of ``at``'s time)."""
        arrays = []
        for name, costs in (("save_cost", save), ("recompute_cost", recompute)):
            costs = np.asarray(costs)
            if costs.dtype != np.int64 or costs.ndim != 1 or (costs < INFINITE).any():
                raise ValueError(f"{name}: an int64 array of non-negative costs and INFINITE, got {costs!r}")
            arrays.append(costs)
        problem = cls.__new__(cls)
        problem.__dict__["cost_arrays"] = tuple(arrays)  # the cached property's value: __post_init__ skips it
        problem.__init__(len(arrays[0]), _with_none(arrays[0]), _with_none(arrays[1]), edges, needed)
        return problem

    @functools.cached_property
    def cost_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(save_cost, recompute_cost) as int64 arrays, ``INFINITE`` for None (computed once, checked)."""
        return _cost_array("save_cost", self.save_cost), _cost_array("recompute_cost", self.recompute_cost)

    def finite_total(self) -> int:
        save, recompute = self.cost_arrays
        return int(save[save > 0].sum() + recompute[recompute > 0].sum())


INFINITE = -1  # a None (infinite) cost in the int64 arrays below


def _cost_array(name: str, costs: tuple[int | None, ...]) -> np.ndarray:
    """The costs as int64, ``INFINITE`` for None; a clear error for anything but non-negative ints and None."""
    values = [INFINITE if c is None else c for c in costs]
    array = np.array(values) if values else np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iub" or array.ndim != 1:
        bad = next((c for c in costs if c is not None and not isinstance(c, (int, np.integer))), array.dtype)
        raise ValueError(f"{name} entries must be non-negative ints or None, got {bad!r}")
    array = array.astype(np.int64)
    for i in np.flatnonzero(array < 0).tolist():  # the Nones, and any negative cost
        if costs[i] is not None:
            raise ValueError(f"{name} entries must be non-negative ints or None, got {costs[i]!r}")
    return array


def _with_none(array: np.ndarray) -> tuple[int | None, ...]:
    """An int64 cost array as the tuple ``CutProblem`` holds: None where ``INFINITE``."""
    costs = array.tolist()
    for i in np.flatnonzero(array == INFINITE).tolist():
        costs[i] = None
    return tuple(costs)


def _structure(edges, needed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edge sources, edge targets, needed values) as int64 arrays.  Cached for tuples: a price sweep solves one
    structure at many prices (``ParametricProblem.at`` passes the same tuples each time), and turning thousands of
    pairs into arrays was a third of a solve."""
    try:
        return _cached_structure(edges, needed)
    except TypeError:  # lists: unhashable, not cached
        return _structure_arrays(edges, needed)


def _structure_arrays(edges, needed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pairs = np.array(edges, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1], np.array(needed, dtype=np.int64).reshape(-1)


_cached_structure = functools.lru_cache(maxsize=16)(_structure_arrays)


@dataclass(frozen=True)
class CutSolution:
    """``saved``: values kept for backward; ``recomputed``: values computed in backward; both sorted and limited
    to what backward actually demands.  ``cut_value`` = the plan's total cost."""

    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    cut_value: int
    solve_seconds: float


def plan_cost(problem: CutProblem, saved: Sequence[int], recomputed: Sequence[int]) -> int | None:
    """The objective of a plan, or None if it uses an infinite edge."""
    save, recompute = problem.cost_arrays
    costs = np.concatenate((save[np.asarray(saved, dtype=np.int64)], recompute[np.asarray(recomputed, dtype=np.int64)]))
    return None if (costs == INFINITE).any() else int(costs.sum())


def check_plan(problem: CutProblem, saved: Sequence[int], recomputed: Sequence[int]) -> list[str]:
    """Validity of a plan: every needed value and every input of a recomputed value is saved or recomputed,
    nothing impossible is chosen.  Returns the list of violations (empty when valid)."""
    saved_set, recomputed_set = set(saved), set(recomputed)
    problems = []
    if saved_set & recomputed_set:
        problems.append(f"both saved and recomputed: {sorted(saved_set & recomputed_set)}")
    available = saved_set | recomputed_set
    for v in problem.needed:
        if v not in available:
            problems.append(f"needed value {v} neither saved nor recomputed")
    for u, w in problem.edges:
        if w in recomputed_set and u not in available:
            problems.append(f"recomputed {w} reads {u}, which is neither saved nor recomputed")
    for v in saved_set:
        if problem.save_cost[v] is None:
            problems.append(f"value {v} cannot be saved")
    for v in recomputed_set:
        if problem.recompute_cost[v] is None:
            problems.append(f"value {v} cannot be recomputed")
    return problems


def _build_network(problem: CutProblem) -> tuple[csr_array, int]:
    n = problem.num_values
    total = problem.finite_total()
    if total >= CAPACITY_LIMIT:
        raise ValueError(
            f"finite capacities sum to {total} >= {CAPACITY_LIMIT}; quantise the costs first "
            "(scipy's max-flow takes int32 capacities and silently truncates larger ones)"
        )
    inf = total + 1
    save, recompute = problem.cost_arrays
    u, w, needed = _structure(problem.edges, problem.needed)
    values = np.arange(n, dtype=np.int64)
    from_source = recompute != 0  # a zero-cost recompute edge is left out (cutting it is free)
    infinite = np.int64(inf)
    # Split edges, recompute edges from the source, data edges, sink edges; the sort below fixes the order.
    # (v_in and v_out are arithmetic: they number whole arrays of values at once)
    rows = np.concatenate((v_in(values), np.full(int(from_source.sum()), SOURCE), v_out(u), v_out(needed)))
    cols = np.concatenate((v_out(values), v_in(values[from_source]), v_in(w), np.full(len(needed), SINK)))
    caps = np.concatenate(
        (
            np.where(save == INFINITE, infinite, save),
            np.where(recompute[from_source] == INFINITE, infinite, recompute[from_source]),
            np.full(len(u), infinite),
            np.full(len(needed), infinite),
        )
    )
    size = 2 + 2 * n
    # Parallel edges with infinite capacity are merged with max, not sum, so that infinity stays in int32.
    keys = rows.astype(np.int64) * size + cols.astype(np.int64)
    cap_arr = caps.astype(np.int64)
    order = np.lexsort((-cap_arr, keys))
    keys, cap_arr = keys[order], cap_arr[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    keys, cap_arr = keys[first], cap_arr[first]
    assert cap_arr.max(initial=0) <= INT32_MAX
    from scipy.sparse import csr_array  # imported on first use: see the note above INT32_MAX

    graph = csr_array((cap_arr.astype(np.int32), (keys // size, keys % size)), shape=(size, size))
    return graph, inf


def _infinite_path(graph: csr_array, inf: int) -> tuple[int, ...] | None:
    """A source->sink path through infinite edges only, as value indices, or None."""
    from scipy.sparse import csr_array  # imported on first use: see the note above INT32_MAX
    from scipy.sparse.csgraph import breadth_first_order

    inf_only = csr_array(graph.multiply(graph >= inf))
    inf_only.eliminate_zeros()
    order, preds = breadth_first_order(inf_only, SOURCE, directed=True, return_predecessors=True)
    if SINK not in set(order.tolist()):
        return None
    path = []
    vertex = SINK
    while vertex != SOURCE and vertex >= 0:
        if vertex >= 2:
            value = (vertex - 2) // 2
            if not path or path[-1] != value:
                path.append(value)
        vertex = preds[vertex]
    return tuple(reversed(path))


def solve_min_cut(problem: CutProblem) -> CutSolution:
    """The minimum-cost valid plan (see module docstring)."""
    start = time.perf_counter()
    n = problem.num_values
    if not problem.needed:
        return CutSolution((), (), 0, time.perf_counter() - start)
    from scipy.sparse import csr_array  # imported on first use: see the note above INT32_MAX
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    graph, inf = _build_network(problem)
    path = _infinite_path(graph, inf)
    if path is not None:
        raise InfeasibleCutError(
            f"no finite cut: values {list(path)} form a chain that can be neither saved nor recomputed", path
        )
    result = maximum_flow(graph, SOURCE, SINK, method="dinic")
    flow = csr_array(result.flow)
    residual = csr_array(graph - flow)
    residual.data[residual.data < 0] = 0  # a reverse edge carries at most its own flow; clip numerical junk
    residual.eliminate_zeros()
    reachable = np.zeros(graph.shape[0], dtype=bool)
    reachable[breadth_first_order(residual, SOURCE, directed=True, return_predecessors=False)] = True
    assert not reachable[SINK], "max-flow left an augmenting path"
    saved, recomputed = _demanded(problem, reachable)
    cost = plan_cost(problem, saved, recomputed)
    # The demanded plan is valid, so it cannot cost less than the min cut; dropping undemanded parts can't add.
    assert cost == int(result.flow_value), (cost, result.flow_value)
    elapsed = time.perf_counter() - start
    log.debug("min cut: %d values, %d edges, cut %d, %.4fs", n, len(problem.edges), cost, elapsed)
    return CutSolution(saved, recomputed, cost, elapsed)


def _demanded(problem: CutProblem, reachable: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(saved, recomputed), sorted: what backward demands of the cut whose source side is ``reachable``.  From the
    needed values, through the inputs of every value computed in backward; a value whose ``v_in`` is on the source side
    is computed in forward and, its ``v_out`` on the sink side, kept for backward (not walked through).  One
    breadth-first search over the values (a root reading the needed ones): a walk value by value in Python would be much
    of a solve on deep graphs, and a ``memory_budget`` partition solves many times (``benchmarks/solve_time.py``)."""
    from scipy.sparse import csr_array  # imported on first use: see the note above INT32_MAX
    from scipy.sparse.csgraph import breadth_first_order

    n = problem.num_values
    u, w, needed = _structure(problem.edges, problem.needed)
    in_forward = reachable[v_in(np.arange(n))]
    through = ~in_forward[w]  # w is computed in backward: its input u is demanded
    rows = np.concatenate((w[through], np.full(len(needed), n)))
    cols = np.concatenate((u[through], needed))
    demand = csr_array((np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(n + 1, n + 1))
    walked = np.zeros(n + 1, dtype=bool)
    walked[breadth_first_order(demand, n, directed=True, return_predecessors=False)] = True
    walked = walked[:n]
    saved = np.flatnonzero(walked & in_forward)
    assert not reachable[v_out(saved)].any()
    return tuple(saved.tolist()), tuple(np.flatnonzero(walked & ~in_forward).tolist())
