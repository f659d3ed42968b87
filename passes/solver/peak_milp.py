"""An exact reference for the step's peak: a Checkmate-style MILP over keep and recompute decisions.  No torch.

After Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization" (MLSys 2020), cut
down to stay tractable: the forward is one stage, the backward is one stage per backward node (or per group of
them, ``ScheduleGraph.stage``), and the backward nodes run once each, in graph order.  Decisions, per stage t:

    R[t, i]  compute i in stage t       (stage 0, forward: each forward node at most once, in graph order;
                                          stage t >= 1: recompute forward node i, or run backward node i of t)
    S[t, i]  i is held from stage t-1 into stage t

**The memory model** (the same in the MILP and in ``evaluate_schedule``, which needs no solver):

* Nodes are in topological order, every forward node before every backward node.  ``free`` nodes (graph inputs,
  parameters, tangents) are always there and cost nothing.
* At the start of stage t the held values S[t, .] are live.  The stage computes its nodes in index order (all
  recomputed forward nodes first, then its backward nodes).  Computing k allocates ``nbytes[k]`` on top of what is
  live (its inputs included); while k runs, ``transient_bytes[k]`` more are held (the inside of a merged node,
  ``peak_milp_graph.py``).  The peak is the most bytes live, transient included, at any node of any stage.
* After k is computed, each of k's inputs and k itself is freed if no later node of the same stage reads it and it
  is not held into the next stage.  A held value nobody reads in a stage stays live to that stage's end.  Nothing
  is held after the last stage: gradients are handed to the caller once read (the *activation* peak).
* The compute of a schedule is the sum of ``compute_seconds`` over every computation, forward, recomputation and
  backward alike.

The MILP minimises the peak P subject to compute <= C (Checkmate's U[t, k] memory after node k and FREE[t, i, k]
"i freed after k", the latter only bounded above: freeing later never lowers the peak, so the optimum frees as
``evaluate_schedule`` does).  ``evaluate_plan`` is the same model applied to one of fxremat's plans: a saved set,
forward computing what the outputs and the saved values need, and backward recomputing lazily (PyTorch's
``reordering_to_mimic_autograd_engine``: a recomputed node runs in the stage of the first backward node that needs
it, and is then held until its last reader; see ``plan_memory.py``).  The MILP may also recompute a value several
times or drop it between stages; a lazy plan may not, which is the difference the benchmark measures
(benchmarks/investigations/peak_milp_gap.py).

scipy's ``milp`` (HiGHS), as in ``milp.py``; a result counts as exact only when HiGHS proves optimality
(``PeakSolution.optimal``).  Bytes and seconds are scaled to O(1) before the solve (HiGHS's tolerances are
absolute, 1e-7: a compute budget of microseconds would be noise to it) and the returned peak is the integer
``evaluate_schedule`` gives for the schedule HiGHS found.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .milp_program import Program

DEFAULT_TIME_LIMIT_S = 120.0
# A compute budget taken from a plan's own float sum is met by that plan: the MILP gets this much slack on top so
# that rounding in a different summation order never makes the plan itself infeasible.
COMPUTE_SLACK = 1e-9


@dataclass(frozen=True)
class ScheduleGraph:
    """A joint forward/backward graph as plain numbers; node index = position in topological order."""

    nbytes: tuple[int, ...]
    compute_seconds: tuple[float, ...]
    inputs: tuple[tuple[int, ...], ...]
    backward: tuple[bool, ...]  # depends on a tangent: runs once, in its own stage
    required: tuple[int, ...]  # forward outputs (computed in forward) and gradients
    free: tuple[bool, ...]  # graph inputs, parameters, tangents: always live, no bytes counted
    recomputable: tuple[bool, ...] = ()  # () = all; a forward node that may run only in forward (random ops)
    transient_bytes: tuple[int, ...] = ()  # () = none; held while the node runs, gone after it
    # () = all; False: a multi-output op (its items are the nodes that own bytes): never held across stages, so an
    # item is computed only where its op runs
    holdable: tuple[bool, ...] = ()
    stage: tuple[int, ...] = ()  # () = one stage per backward node; else 0 for forward, 1.. for backward
    # () = none; True: a backward node kept to the step's end once made (a parameter gradient, as a training step
    # holds it until the optimizer reads it): the peak is then the step's, not the activations' alone
    kept: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.nbytes)
        for name in ("compute_seconds", "inputs", "backward", "free"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"ScheduleGraph.{name} needs one entry per node ({n})")
        for name in ("recomputable", "transient_bytes", "holdable", "stage", "kept"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise ValueError(f"ScheduleGraph.{name} needs one entry per node ({n}), or none")
        seen_backward = False
        for i in range(n):
            if any(not 0 <= a < i for a in self.inputs[i]):
                raise ValueError(f"node {i} reads a node that is not before it: {self.inputs[i]}")
            if self.free[i]:
                continue
            if self.backward[i]:
                seen_backward = True
            elif seen_backward:
                raise ValueError(f"forward node {i} comes after a backward node: put every forward node first")
            if not self.backward[i] and any(self.backward[a] and not self.free[a] for a in self.inputs[i]):
                raise ValueError(f"forward node {i} reads a backward node")
        stages = [self.stage_of(i) for i in self.backward_nodes]
        if stages != sorted(stages) or (stages and (stages[0] != 1 or len(set(stages)) != stages[-1])):
            raise ValueError("backward stages must run 1, 2, ... in node order, with none empty")
        if any(self.free[r] for r in self.required):
            raise ValueError("a free node cannot be required")
        if any(self.is_kept(i) and not self.backward[i] for i in range(n)):
            raise ValueError("only backward nodes can be kept to the step's end")

    def __len__(self) -> int:
        return len(self.nbytes)

    def stage_of(self, i: int) -> int:
        if self.stage:
            return self.stage[i]
        return 0 if not self.backward[i] else self.backward_nodes.index(i) + 1

    def may_recompute(self, i: int) -> bool:
        return not self.recomputable or self.recomputable[i]

    def may_hold(self, i: int) -> bool:
        return not self.holdable or self.holdable[i]

    def transient(self, i: int) -> int:
        return self.transient_bytes[i] if self.transient_bytes else 0

    def is_kept(self, i: int) -> bool:
        return bool(self.kept) and self.kept[i] and not self.free[i]

    @functools.cached_property
    def kept_before(self) -> tuple[int, ...]:
        """Per stage, the bytes of kept nodes made in earlier stages: live at every node of it (backward nodes run
        once, in their own stage, so this is the same for every schedule)."""
        out = [0] * (self.num_stages + 2)
        for i in self.backward_nodes:
            if self.is_kept(i):
                out[self.stage_of(i) + 1] += self.nbytes[i]
        for t in range(1, len(out)):
            out[t] += out[t - 1]
        return tuple(out[: self.num_stages + 1])

    @functools.cached_property
    def forward_nodes(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self)) if not self.free[i] and not self.backward[i])

    @functools.cached_property
    def backward_nodes(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self)) if not self.free[i] and self.backward[i])

    @functools.cached_property
    def num_stages(self) -> int:
        """Backward stages (stage 0, forward, not counted)."""
        return max((self.stage_of(i) for i in self.backward_nodes), default=0)

    @functools.cached_property
    def members(self) -> tuple[tuple[int, ...], ...]:
        """The backward nodes of each stage (index 0: forward, none)."""
        out: list[list[int]] = [[] for _ in range(self.num_stages + 1)]
        for i in self.backward_nodes:
            out[self.stage_of(i)].append(i)
        return tuple(tuple(m) for m in out)

    @functools.cached_property
    def reads(self) -> tuple[tuple[int, ...], ...]:
        """Inputs that are not free (what must be live when a node runs)."""
        return tuple(tuple(dict.fromkeys(a for a in self.inputs[i] if not self.free[a])) for i in range(len(self)))

    @functools.cached_property
    def readers(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(len(self))]
        for i in range(len(self)):
            for a in self.reads[i]:
                out[a].append(i)
        return tuple(tuple(r) for r in out)

    @functools.cached_property
    def last_needed_stage(self) -> tuple[int, ...]:
        """Per node, the last stage with a backward node that depends on it (0: none), through any path."""
        last = [0] * len(self)
        for i in reversed(range(len(self))):
            if self.backward[i] and not self.free[i]:
                last[i] = self.stage_of(i)
            for r in self.readers[i]:
                last[i] = max(last[i], last[r])
        return tuple(last)

    @functools.cached_property
    def forward_outputs(self) -> tuple[int, ...]:
        return tuple(r for r in self.required if not self.backward[r])


@dataclass(frozen=True)
class Schedule:
    """What each stage computes and what it starts with (index 0: forward, which starts with nothing)."""

    computed: tuple[frozenset[int], ...]
    held: tuple[frozenset[int], ...]


@dataclass(frozen=True)
class ScheduleCost:
    peak_bytes: int
    compute_seconds: float
    peak_stage: int
    peak_node: int


class InvalidSchedule(ValueError):
    """A schedule that reads a value that is not live, or leaves out a required node."""


def evaluate_schedule(graph: ScheduleGraph, schedule: Schedule) -> ScheduleCost:
    """Peak and compute of ``schedule`` under the module's memory model (no solver)."""
    stages = graph.num_stages + 1
    if len(schedule.computed) != stages or len(schedule.held) != stages:
        raise InvalidSchedule(f"a schedule of {graph.num_stages} backward stages has {stages} entries per field")
    _check_required(graph, schedule)
    peak, where, compute = 0, (0, -1), 0.0
    for t in range(stages):
        held_next = schedule.held[t + 1] if t + 1 < stages else frozenset()
        if held_next - schedule.held[t] - schedule.computed[t]:
            raise InvalidSchedule(f"stage {t + 1} holds {sorted(held_next - schedule.held[t] - schedule.computed[t])}")
        if any(not graph.may_hold(i) for i in schedule.held[t]):
            unholdable = sorted(i for i in schedule.held[t] if not graph.may_hold(i))
            raise InvalidSchedule(f"stage {t} holds a node that cannot be held: {unholdable}")
        if schedule.held[t] & schedule.computed[t]:
            raise InvalidSchedule(
                f"stage {t} computes values it holds: {sorted(schedule.held[t] & schedule.computed[t])}"
            )
        order = sorted(schedule.computed[t])
        last_read = {a: position for position, k in enumerate(order) for a in graph.reads[k]}
        live = {i: 0 if graph.is_kept(i) else graph.nbytes[i] for i in schedule.held[t]}  # kept: in kept_before
        total = sum(live.values()) + graph.kept_before[t]
        for position, k in enumerate(order):
            missing = [a for a in graph.reads[k] if a not in live]
            if missing:
                raise InvalidSchedule(f"stage {t}: node {k} reads {missing}, which are not live")
            live[k] = graph.nbytes[k]
            total += graph.nbytes[k]
            compute += graph.compute_seconds[k]
            if total + graph.transient(k) > peak:
                peak, where = total + graph.transient(k), (t, k)
            for i in (*graph.reads[k], k):
                if i in live and i not in held_next and last_read.get(i, -1) <= position and not graph.is_kept(i):
                    total -= live.pop(i)
    return ScheduleCost(peak_bytes=peak, compute_seconds=compute, peak_stage=where[0], peak_node=where[1])


def _check_required(graph: ScheduleGraph, schedule: Schedule) -> None:
    if schedule.held[0]:
        raise InvalidSchedule("forward starts with nothing held")
    for o in graph.forward_outputs:
        if o not in schedule.computed[0]:
            raise InvalidSchedule(f"forward output {o} is not computed in forward")
    for t, members in enumerate(graph.members):
        for b in members:
            if b not in schedule.computed[t]:
                raise InvalidSchedule(f"backward node {b} is not computed in its stage {t}")
    for t, computed in enumerate(schedule.computed):
        wrong = [i for i in computed if graph.free[i] or (graph.backward[i] and graph.stage_of(i) != t)]
        wrong += [i for i in computed if t and not graph.backward[i] and not graph.may_recompute(i)]
        if wrong:
            raise InvalidSchedule(f"stage {t} may not compute {sorted(wrong)}")


def plan_schedule(graph: ScheduleGraph, saved: Iterable[int]) -> Schedule:
    """fxremat's plan that saves ``saved`` (forward nodes) as a schedule: forward computes what the outputs and the
    saved values need; backward recomputes lazily, each value once, in the stage of its first reader, and holds it
    until its last reader."""
    saved = {s for s in saved if not graph.free[s]}
    if any(graph.backward[s] for s in saved):
        raise ValueError(f"saved backward nodes: {sorted(s for s in saved if graph.backward[s])}")
    computed: list[set[int]] = [set() for _ in range(graph.num_stages + 1)]
    stack = [*graph.forward_outputs, *saved]
    while stack:
        i = stack.pop()
        if i not in computed[0]:
            computed[0].add(i)
            stack.extend(graph.reads[i])
    recomputed_in: dict[int, int] = {}
    needed = _recompute_closure(graph, saved)
    for t in range(1, graph.num_stages + 1):
        computed[t].update(graph.members[t])
        stack = [a for b in graph.members[t] for a in graph.reads[b]]
        while stack:
            i = stack.pop()
            if graph.backward[i] or i in saved or i in recomputed_in:
                continue
            if not graph.may_recompute(i):
                raise ValueError(f"node {i} may not be recomputed: the plan must save it")
            recomputed_in[i] = t
            computed[t].add(i)
            stack.extend(graph.reads[i])
            if not graph.may_hold(i):  # a multi-output op makes all its outputs at once: those backward needs
                stack.extend(r for r in graph.readers[i] if r in needed)
    return Schedule(tuple(frozenset(c) for c in computed), _held_until_last_read(graph, computed))


def _recompute_closure(graph: ScheduleGraph, saved: set[int]) -> set[int]:
    """The forward nodes backward reads, directly or through other unsaved forward nodes."""
    seen: set[int] = set()
    stack = [a for b in graph.backward_nodes for a in graph.reads[b]]
    while stack:
        i = stack.pop()
        if i not in seen and not graph.backward[i] and i not in saved:
            seen.add(i)
            stack.extend(graph.reads[i])
    return seen


def _held_until_last_read(graph: ScheduleGraph, computed: list[set[int]]) -> tuple[frozenset[int], ...]:
    """Each stage holds what an earlier stage computed and a later one reads before computing it again."""
    stages = len(computed)
    read_in: list[set[int]] = [{a for k in c for a in graph.reads[k]} for c in computed]
    held: list[set[int]] = [set() for _ in range(stages)]
    for i in range(len(graph)):
        made = [t for t in range(stages) if i in computed[t]]
        for start, end in zip(made, [*made[1:], stages]):
            readers = [t for t in range(start + 1, end) if i in read_in[t]]
            for t in range(start + 1, max(readers, default=start) + 1):
                held[t].add(i)
    return tuple(frozenset(h) for h in held)


def saved_bytes(graph: ScheduleGraph, schedule: Schedule) -> int:
    """Bytes held from forward into backward."""
    return sum(graph.nbytes[i] for i in schedule.held[1]) if graph.num_stages else 0


def evaluate_plan(graph: ScheduleGraph, saved: Iterable[int]) -> ScheduleCost:
    return evaluate_schedule(graph, plan_schedule(graph, saved))


@dataclass(frozen=True)
class PeakSolution:
    peak_bytes: int  # evaluate_schedule's peak of the schedule found
    compute_seconds: float
    optimal: bool  # HiGHS proved it optimal (within its default relative gap, 1e-4)
    lower_bound_bytes: int  # HiGHS's dual bound: no schedule has a lower peak
    schedule: Schedule | None  # None: no feasible schedule found in time
    solve_seconds: float
    message: str


def _computable(graph: ScheduleGraph, t: int) -> list[int]:
    """Nodes stage t may compute; a forward node only while some backward stage from t on depends on it."""
    if t == 0:
        return list(graph.forward_nodes)
    forward = [i for i in graph.forward_nodes if graph.may_recompute(i) and graph.last_needed_stage[i] >= t]
    return [*forward, *graph.members[t]]


def _holdable(graph: ScheduleGraph, t: int) -> list[int]:
    """Nodes stage t may start with: forward ones something from t on needs, backward ones read from t on."""
    forward = [i for i in graph.forward_nodes if graph.last_needed_stage[i] >= t and graph.may_hold(i)]
    backward = [
        b
        for b in graph.backward_nodes
        if graph.stage_of(b) < t <= max(map(graph.stage_of, graph.readers[b]), default=0)
    ]
    return [*forward, *backward]


def _add_decisions(program: Program, graph: ScheduleGraph) -> list[list[int]]:
    """R and S columns, dependency and holding rows; returns each stage's computable nodes in order."""
    outputs = set(graph.forward_outputs)
    orders = []
    for t in range(graph.num_stages + 1):
        order = _computable(graph, t)
        for i in order:
            fixed = graph.backward[i] or (t == 0 and i in outputs)
            program.var(("R", t, i), lower=1.0 if fixed else 0.0)
        if t:
            for i in _holdable(graph, t):
                program.var(("S", t, i))
        orders.append(order)
    for t, order in enumerate(orders):
        for k in order:
            for a in graph.reads[k]:  # what k reads is computed earlier in the stage or held into it
                program.row(
                    [(program.col("R", t, k), 1.0), (program.col("R", t, a), -1.0), (program.col("S", t, a), -1.0)],
                    -np.inf,
                    0.0,
                )
        for i in graph.forward_nodes if t else ():
            program.row([(program.col("R", t, i), 1.0), (program.col("S", t, i), 1.0)], -np.inf, 1.0)
        if t + 1 < len(orders):
            for i in _holdable(graph, t + 1):  # held into t+1: computed in t or held into t
                program.row(
                    [(program.col("S", t + 1, i), 1.0), (program.col("R", t, i), -1.0), (program.col("S", t, i), -1.0)],
                    -np.inf,
                    0.0,
                )
    return orders


def _add_memory(program: Program, graph: ScheduleGraph, orders: list[list[int]], unit: float) -> None:
    """Checkmate's memory rows: U[t, k] (bytes live after k is computed, in ``unit``) <= P; a kept node is never
    freed, and counts from the next stage on in ``kept_before`` (the first U of a stage starts there)."""
    peak = program.col("P")
    for t, order in enumerate(orders):
        position = {k: p for p, k in enumerate(order)}
        holdable = [i for i in (_holdable(graph, t) if t else ()) if not graph.is_kept(i)]
        previous: list[tuple[int | None, float]] = [(program.col("S", t, i), -graph.nbytes[i] / unit) for i in holdable]
        constant = graph.kept_before[t] / unit
        for k in order:
            live = program.var(("U", t, k), upper=np.inf, integer=False)
            computed = program.col("R", t, k)
            program.row([(live, 1.0), *previous, (computed, -graph.nbytes[k] / unit)], constant, constant)
            program.row([(live, 1.0), (computed, graph.transient(k) / unit), (peak, -1.0)], -np.inf, 0.0)
            previous, constant = [(live, -1.0)], 0.0
            for i in dict.fromkeys((*graph.reads[k], k)):
                if graph.is_kept(i) or (program.col("R", t, i) is None and program.col("S", t, i) is None):
                    continue
                freed = program.var(("F", t, i, k))
                previous.append((freed, graph.nbytes[i] / unit))
                program.row([(freed, 1.0), (computed, -1.0)], -np.inf, 0.0)
                program.row([(freed, 1.0), (program.col("S", t + 1, i), 1.0)], -np.inf, 1.0)
                for j in graph.readers[i]:
                    if position.get(j, -1) > position[k]:  # a later reader in this stage keeps i
                        program.row([(freed, 1.0), (program.col("R", t, j), 1.0)], -np.inf, 1.0)


def least_peak(graph: ScheduleGraph) -> int:
    """A bound every schedule meets (the floor): a node that must run holds its inputs, its output and its transient
    at once, and a backward node the kept bytes of the stages before its own.  (As P's lower bound it lets HiGHS
    prove optimality where the peak sits at one such node.)"""
    must, stack = set(), [*graph.required, *graph.backward_nodes]
    while stack:
        i = stack.pop()
        if i not in must and not graph.free[i]:
            must.add(i)
            stack.extend(graph.reads[i])

    def at(k: int) -> int:  # a backward node also meets the kept bytes of the stages before its own
        stage = graph.stage_of(k) if graph.backward[k] else 0
        earlier = [a for a in graph.reads[k] if graph.is_kept(a) and graph.stage_of(a) < stage]  # in kept_before
        reads = sum(graph.nbytes[a] for a in graph.reads[k]) - sum(graph.nbytes[a] for a in earlier)
        return graph.kept_before[stage] + graph.nbytes[k] + graph.transient(k) + reads

    return max((at(k) for k in must), default=0)


def solve_min_peak(
    graph: ScheduleGraph,
    max_compute_seconds: float | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT_S,
    max_saved_bytes: int | None = None,
) -> PeakSolution:
    """The schedule of least peak whose compute is at most ``max_compute_seconds`` (None: unbounded) and, with
    ``max_saved_bytes``, that holds at most that many bytes from forward into backward (a ``memory_budget``'s cap:
    ``saved_bytes`` of a plan's schedule)."""
    start = time.perf_counter()
    unit = float(max([1, *graph.nbytes, *(graph.transient(i) for i in range(len(graph)))]))
    program = Program()
    program.var(("P",), lower=least_peak(graph) / unit, upper=np.inf, integer=False)
    program.cost[program.col("P")] = 1.0
    orders = _add_decisions(program, graph)
    _add_memory(program, graph, orders, unit)
    if max_compute_seconds is not None:
        scale = max(max_compute_seconds, 1e-30)
        terms = [(program.col("R", t, i), graph.compute_seconds[i] / scale) for t, o in enumerate(orders) for i in o]
        program.row(terms, -np.inf, 1.0 + COMPUTE_SLACK)
    if max_saved_bytes is not None and graph.num_stages:
        held = [(program.col("S", 1, i), graph.nbytes[i] / unit) for i in _holdable(graph, 1)]
        program.row(held, -np.inf, max_saved_bytes / unit + COMPUTE_SLACK)
    result = program.solve(time_limit)
    bound = getattr(result, "mip_dual_bound", None)
    lower = int(np.ceil(bound * unit - 1e-6 * unit)) if bound is not None and np.isfinite(bound) else 0
    if result.x is None:
        return PeakSolution(0, 0.0, False, lower, None, time.perf_counter() - start, result.message)
    x = np.round(result.x)
    computed = [{i for i in order if x[program.col("R", t, i)]} for t, order in enumerate(orders)]
    schedule = Schedule(tuple(frozenset(c) for c in computed), _held_until_last_read(graph, computed))
    cost = evaluate_schedule(graph, schedule)
    return PeakSolution(
        peak_bytes=cost.peak_bytes,
        compute_seconds=cost.compute_seconds,
        optimal=result.status == 0,
        lower_bound_bytes=min(lower, cost.peak_bytes),
        schedule=schedule,
        solve_seconds=time.perf_counter() - start,
        message=result.message,
    )
