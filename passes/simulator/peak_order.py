"""Inductor's reordering for peak memory (``config.reorder_for_peak_memory``, on by default), on plain integers.

After fusion, Inductor's scheduler estimates the graph's peak memory in its kernel order and in three other
topological orders, and keeps the lowest (``torch/_inductor/memory.py`` ``reorder_for_peak_memory``; the order it
was given wins a tie): ``lpmf`` (least peak memory first, greedy), ``bfs`` (a kernel whose inputs were computed
earliest first) and ``dfs`` (each kernel after its dependencies, the smaller ones first).  Its estimate has no
in-place writes and no buffer pool: a buffer is allocated at its kernel and freed after its last reader, a graph
output never, a graph input it may free (a backward's saved tensors) is counted from the start to its last reader,
and an input it may not (parameters, tangents) not at all.  The simulator then walks the order chosen
(``phase._Phase.fusion_order``), which is what Inductor's code runs: the reordering changes how many C++ units a
backward compiles to, and its peak (docs/DESIGN.md §6).

Kernels are numbered 0..n-1 in the order they come in; this module never imports torch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Buffer:
    size: int
    producer: int  # the kernel that allocates it; -1 for a graph input Inductor may free
    readers: frozenset[int]  # the kernels, other than its producer, that read it
    output: bool = False  # a graph output: never freed


@dataclass(frozen=True)
class OrderProblem:
    preds: tuple[frozenset[int], ...]  # per kernel: the kernels it must run after
    buffers: tuple[Buffer, ...]
    # whether the estimate holds a graph output from its kernel on (torch 2.13 on); before, it subtracts the
    # output's bytes at the start: counted for nothing after its kernel, less than nothing before
    outputs_held: bool = True

    @property
    def size(self) -> int:
        return len(self.preds)

    def allocated(self) -> list[int]:
        """Per kernel: the bytes its buffers allocate."""
        sizes = [0] * self.size
        for b in self.buffers:
            if b.producer >= 0:
                sizes[b.producer] += b.size
        return sizes

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in range(self.size)]
        for k, preds in enumerate(self.preds):
            for p in preds:
                succ[p].append(k)
        return succ

    def reads(self) -> list[list[int]]:
        """Per kernel: the buffers (indices) it reads."""
        found: list[list[int]] = [[] for _ in range(self.size)]
        for i, b in enumerate(self.buffers):
            for k in b.readers:
                found[k].append(i)
        return found


def estimate_peak(problem: OrderProblem, order: list[int]) -> int:
    """Inductor's estimate of the peak in ``order`` (``memory.estimate_peak_memory``)."""
    step = {k: s for s, k in enumerate(order)}
    delta = [0] * (len(order) + 1)
    for b in problem.buffers:
        start = 0 if b.producer < 0 else step[b.producer]
        delta[start] += b.size
        if not b.output:
            end = max((step[r] for r in b.readers), default=start)
            delta[end + 1] -= b.size
        elif not problem.outputs_held:
            delta[0] -= b.size
    peak = now = 0
    for d in delta:
        now += d
        peak = max(peak, now)
    return peak


def lpmf(problem: OrderProblem) -> list[int]:
    """Least peak memory first (``memory.topological_sort_lpmf``): among the kernels ready, one that fits under the
    peak so far and leaves the least live, else the one that allocates least; ties to the earlier kernel."""
    sizes, succ, reads = problem.allocated(), problem.successors(), problem.reads()
    indegree = [len(p) for p in problem.preds]
    outdegree = [len(b.readers) + b.output for b in problem.buffers]
    to_free = [0] * problem.size
    for k, read in enumerate(reads):
        to_free[k] += sum(problem.buffers[i].size for i in read if outdegree[i] == 1)
    for b, out in zip(problem.buffers, outdegree):
        if b.producer >= 0 and out == 0:
            to_free[b.producer] += b.size
    live = sum(b.size for b in problem.buffers if b.producer < 0)
    most = max(live, sum(b.size for b in problem.buffers if b.output))
    ready = {k for k in range(problem.size) if indegree[k] == 0}
    schedule: list[int] = []
    while ready:
        gap = most - live
        chosen = min(ready, key=lambda k: (sizes[k] if sizes[k] > gap else 0, sizes[k] - to_free[k], k))
        ready.remove(chosen)
        schedule.append(chosen)
        live += sizes[chosen]
        most = max(most, live)
        live -= to_free[chosen]
        for s in succ[chosen]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.add(s)
        for i in reads[chosen]:
            outdegree[i] -= 1
            if outdegree[i] == 1:  # the one reader left frees it
                for r in problem.buffers[i].readers:
                    to_free[r] += problem.buffers[i].size
    return schedule


def bfs(problem: OrderProblem) -> list[int]:
    """First in, first out (``memory.topological_sort_bfs``): the ready kernel whose dependencies ran earliest (their
    places, sorted, compared as lists), ties to the earlier kernel."""
    succ = problem.successors()
    indegree = [len(p) for p in problem.preds]
    place = [-1] * problem.size

    def entry(k: int) -> tuple[list[int], int]:
        return sorted({place[p] for p in problem.preds[k]}), k

    heap = [entry(k) for k in range(problem.size) if indegree[k] == 0]
    heapq.heapify(heap)
    schedule: list[int] = []
    while heap:
        _, chosen = heapq.heappop(heap)
        place[chosen] = len(schedule)
        schedule.append(chosen)
        for s in succ[chosen]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(heap, entry(s))
    return schedule


def dfs(problem: OrderProblem) -> list[int]:
    """Dependencies first (``memory.topological_sort_dfs``): kernels visited, and each one's dependencies, in
    ascending order of the bytes they allocate and read."""
    sizes, reads = problem.allocated(), problem.reads()
    weight = [(sizes[k] + sum(problem.buffers[i].size for i in reads[k]), k) for k in range(problem.size)]
    preds = [sorted(p, key=weight.__getitem__) for p in problem.preds]
    seen = [False] * problem.size
    schedule: list[int] = []
    for start in sorted(range(problem.size), key=weight.__getitem__):
        if seen[start]:
            continue
        seen[start] = True
        stack = [(start, iter(preds[start]))]  # a stack, not recursion: a chain of kernels can be long
        while stack:
            k, pending = stack[-1]
            nxt = next((p for p in pending if not seen[p]), None)
            if nxt is None:
                schedule.append(k)
                stack.pop()
            else:
                seen[nxt] = True
                stack.append((nxt, iter(preds[nxt])))
    return schedule


METHODS = (lpmf, bfs, dfs)


def reordered(problem: OrderProblem, margin: float = 0.0) -> list[int]:
    """The order Inductor keeps: the lowest estimate of the kernels' own order (``range``) and the three sorts, the
    first of them on a tie.  ``margin``: a sort must be lower than the given order by more than this fraction of
    its estimate to be kept (the caller's estimate of Inductor's estimate is not exact: see ``phase_reorder``)."""
    given = list(range(problem.size))
    best, lowest = given, estimate_peak(problem, given)
    ceiling = lowest * (1.0 - margin)
    for method in METHODS:
        order = method(problem)
        if len(order) < problem.size:
            return given  # the kernels' dependencies have a cycle (lpmf and bfs leave kernels out): no sort of them
        peak = estimate_peak(problem, order)
        if peak < lowest and peak < ceiling:
            best, lowest = order, peak
    return best
