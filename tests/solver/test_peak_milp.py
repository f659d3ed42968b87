"""The exact peak MILP (passes/solver/peak_milp.py) on literal graphs with hand-counted peaks, and against brute force
over every schedule of small random graphs.  No torch."""

from __future__ import annotations

import dataclasses
import itertools
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxremat_passes.solver.peak_milp import (
    InvalidSchedule,
    Schedule,
    ScheduleGraph,
    _computable,
    _held_until_last_read,
    evaluate_plan,
    evaluate_schedule,
    plan_schedule,
    saved_bytes,
    solve_min_peak,
)


def training_chain(n: int, residual: bool = False) -> ScheduleGraph:
    """x (free) -> f1 -> ... -> fn (the output), then g_n .. g_1 with g_i reading g_{i+1} (the tangent for g_n)
    and f_{i-1}: every node 1 byte and 1 second (backward 0 s).  ``residual``: f_i also reads f_{i-2}."""
    nbytes, seconds, inputs, backward, free = [0], [0.0], [()], [False], [True]
    for i in range(1, n + 1):
        reads = (i - 1, i - 2) if residual and i >= 2 else (i - 1,)
        nbytes, seconds, inputs = [*nbytes, 1], [*seconds, 1.0], [*inputs, reads]
        backward, free = [*backward, False], [*free, False]
    tangent = n + 1
    nbytes, seconds, inputs, backward, free = (
        [*nbytes, 0],
        [*seconds, 0.0],
        [*inputs, ()],
        [*backward, True],
        [*free, True],
    )
    previous = tangent
    for i in range(n, 0, -1):
        inputs.append((previous, i - 1))
        nbytes, seconds, backward, free = [*nbytes, 1], [*seconds, 0.0], [*backward, True], [*free, False]
        previous = len(inputs) - 1
    return ScheduleGraph(tuple(nbytes), tuple(seconds), tuple(inputs), tuple(backward), (n, previous), tuple(free))


def diamond() -> ScheduleGraph:
    """x -> a (2 bytes) -> b, c -> d (the output); gd reads b, c; gb and gc read gd, a; ga reads gb, gc."""
    #            x    a       b     c     d       t     gd          gb       gc       ga
    inputs = ((), (0,), (1,), (1,), (2, 3), (), (5, 2, 3), (6, 1), (6, 1), (7, 8, 0))
    return ScheduleGraph(
        nbytes=(0, 2, 1, 1, 1, 0, 1, 1, 1, 1),
        compute_seconds=(0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        inputs=inputs,
        backward=(False,) * 5 + (True,) * 5,
        required=(4, 9),
        free=(True, False, False, False, False, True, False, False, False, False),
    )


def kept_gradients(graph: ScheduleGraph) -> ScheduleGraph:
    """``graph`` with every backward node kept to the step's end (as a training step keeps parameter gradients)."""
    return dataclasses.replace(graph, kept=tuple(b and not f for b, f in zip(graph.backward, graph.free)))


# (graph, saved, peak, compute): counted by hand, in the comments
PLAN_CASES = [
    # keep all: forward ends with f1..f9 live (9); g9's stage starts with f1..f8 and adds g9 (9)
    pytest.param(training_chain(9), range(1, 9), 9, 9.0, id="chain9-keep-all"),
    # save nothing: g9's stage recomputes f1..f8 and holds each until its g reads it, then adds g9: 9 bytes
    pytest.param(training_chain(9), (), 9, 17.0, id="chain9-save-nothing"),
    # sqrt checkpoints f3, f6: g9's stage starts with f3, f6, recomputes f7 (held for g8) and f8, adds g9: 5 bytes;
    # g6's stage: f3, g7, then f4 (held for g5), f5, g6: 5.  Forward: f3, f6, f8, f9 at f9: 4.  Compute 9 + 6.
    pytest.param(training_chain(9), (3, 6), 5, 15.0, id="chain9-sqrt"),
    # the same with every g kept to the end: g3's stage holds g9..g4 (6) and recomputes f1 (held for g2), f2, then
    # g3: 9; g1's stage: g9..g2 and g1: 9 (g6's: g9, g8, g7, f3, f4, f5, g6: 7)
    pytest.param(kept_gradients(training_chain(9)), (3, 6), 9, 15.0, id="chain9-sqrt-kept"),
    # forward: a, b, c, d (5); gd's stage: a, b, c held + gd (5); gc's: a, gd, gb + gc (5)
    pytest.param(diamond(), (1, 2, 3), 5, 4.0, id="diamond-keep-all"),
    # forward peaks at c (a, b, c: 4); gd's stage recomputes a, b, c (a held for gb, gc) and adds gd: 5
    pytest.param(diamond(), (), 5, 7.0, id="diamond-save-nothing"),
    # save a: gd's stage starts with a, recomputes b, c, adds gd: 5; forward: a, b, c, then d with a freed: 4
    pytest.param(diamond(), (1,), 5, 6.0, id="diamond-save-a"),
]


@pytest.mark.parametrize("graph, saved, peak, compute", PLAN_CASES)
def test_plan_evaluation_matches_hand_counts(graph, saved, peak, compute):
    cost = evaluate_plan(graph, saved)
    assert (cost.peak_bytes, cost.compute_seconds) == (peak, compute)


@pytest.mark.parametrize("graph, saved, peak, compute", PLAN_CASES)
def test_milp_is_never_above_a_plan_at_its_compute(graph, saved, peak, compute):
    solution = solve_min_peak(graph, compute, time_limit=20)
    assert solution.optimal and solution.peak_bytes <= peak and solution.compute_seconds <= compute
    assert solution.lower_bound_bytes <= solution.peak_bytes
    assert evaluate_schedule(graph, solution.schedule).peak_bytes == solution.peak_bytes


# (graph, compute budget, optimal peak)
OPTIMA = [
    # no compute to spare: every f forward needs is held until its g: the keep-all peak
    pytest.param(training_chain(6), 6.0, 6, id="chain6-no-recompute"),
    # unbounded compute: recompute from x in every stage; g_{i+1}, f_{i-1}, g_i are live at once (3), no fewer
    pytest.param(training_chain(6), None, 3, id="chain6-unbounded"),
    pytest.param(training_chain(9), None, 3, id="chain9-unbounded"),
    # every g kept: g_i's stage holds g6..g_{i+1} (6 - i) besides what it recomputes; at g1 all six gradients are
    # live (g1 reads g2 and x): 6, however the forward is recomputed (at g_i, i >= 3: 6 - i + f_{j-1}, f_j = 8 - i)
    pytest.param(kept_gradients(training_chain(6)), None, 6, id="chain6-kept-unbounded"),
    # a residual chain: g_i's stage needs f_{i-1} and f_{i-2} (to recompute f_{i-1}) besides g_{i+1}, g_i: 4
    pytest.param(training_chain(6, residual=True), None, 4, id="residual6-unbounded"),
    # the diamond: gd needs b, c and a (held for gb, gc, as recomputing it needs compute), or recompute a twice...
    # by hand: b, c, gd live at gd plus a (2) = 5 unless a is dropped and recomputed later: b, c, gd = 3, then
    # gb's stage recomputes a: gd, a, gb = 4, gc's: gd, gb, a, gc = 5 -> the peak is 5 either way
    pytest.param(diamond(), None, 5, id="diamond-unbounded"),
]


@pytest.mark.parametrize("graph, compute, peak", OPTIMA)
def test_known_optima(graph, compute, peak):
    solution = solve_min_peak(graph, compute, time_limit=20)
    assert solution.optimal and solution.peak_bytes == peak


@pytest.mark.parametrize(
    "cap, peak",
    [
        # 17 s is forward (9) plus one recompute of each of f1..f8: saving nothing, every f is recomputed once and
        # held from g9's stage to its reader, as the save-nothing plan does (9 bytes)
        (0, 9),
        (1, 5),
        (2, 4),
        (None, 4),
    ],
)
def test_a_saved_bytes_cap_holds_and_costs_peak(cap, peak):
    graph = training_chain(9)
    solution = solve_min_peak(graph, 17.0, time_limit=20, max_saved_bytes=cap)
    assert solution.optimal and solution.peak_bytes == peak
    assert cap is None or saved_bytes(graph, solution.schedule) <= cap
    assert evaluate_plan(graph, ()).peak_bytes == 9 and saved_bytes(graph, plan_schedule(graph, (3, 6))) == 2


def test_invalid_schedules_are_refused():
    graph = training_chain(3)
    good = plan_schedule(graph, (1, 2))
    evaluate_schedule(graph, good)
    missing = Schedule(good.computed, (frozenset(),) * 4)  # g3 reads f2, which nothing holds
    with pytest.raises(InvalidSchedule, match="not live"):
        evaluate_schedule(graph, missing)
    no_output = Schedule((frozenset({1, 2}), *good.computed[1:]), good.held)
    with pytest.raises(InvalidSchedule, match="forward output"):
        evaluate_schedule(graph, no_output)
    with pytest.raises(ValueError, match="before it"):
        ScheduleGraph((1, 1), (1.0, 1.0), ((1,), ()), (False, False), (0,), (False, False))


def test_a_node_that_may_not_be_recomputed_must_be_saved():
    chain = training_chain(4)
    graph = dataclasses.replace(chain, recomputable=(True, True, False, True, True) + (True,) * 5)
    with pytest.raises(ValueError, match="may not be recomputed"):
        plan_schedule(graph, ())
    solution = solve_min_peak(graph, None, time_limit=20)
    assert solution.optimal and all(2 not in c for c in solution.schedule.computed[1:])


def random_graph(rng: random.Random, forward: int, backward: int, kept: bool = False) -> ScheduleGraph:
    """x (free), ``forward`` nodes reading earlier ones, a tangent (free), ``backward`` nodes each reading the
    previous one (or the tangent) and some forward nodes; the last forward and the last backward node required."""
    nbytes, seconds, inputs, is_backward, free = [0], [0.0], [()], [False], [True]
    for i in range(1, forward + 1):
        reads = tuple(sorted(set(rng.sample(range(i), k=min(i, rng.randint(1, 2))))))
        nbytes, seconds, inputs = [*nbytes, rng.randint(1, 4)], [*seconds, float(rng.randint(1, 3))], [*inputs, reads]
        is_backward, free = [*is_backward, False], [*free, False]
    nbytes, seconds, inputs, is_backward, free = (
        [*nbytes, 0],
        [*seconds, 0.0],
        [*inputs, ()],
        [*is_backward, True],
        [*free, True],
    )
    previous = forward + 1
    for _ in range(backward):
        reads = (previous, *sorted(set(rng.sample(range(1, forward + 1), k=min(forward, rng.randint(1, 2))))))
        inputs.append(reads)
        nbytes, seconds, is_backward, free = (
            [*nbytes, rng.randint(1, 4)],
            [*seconds, 0.0],
            [*is_backward, True],
            [*free, False],
        )
        previous = len(inputs) - 1
    recomputable = tuple(rng.random() > 0.15 for _ in nbytes)
    graph = ScheduleGraph(
        tuple(nbytes), tuple(seconds), tuple(inputs), tuple(is_backward), (forward, previous), tuple(free), recomputable
    )
    if kept:  # some backward nodes kept to the step's end (``kept``: ``False`` keeps none)
        graph = dataclasses.replace(
            graph, kept=tuple(b and not f and rng.random() < 0.6 for b, f in zip(is_backward, free))
        )
    return graph


def brute_force_min_peak(graph: ScheduleGraph, compute: float | None) -> int | None:
    """Every choice of what each stage computes, each held for as short as it can be (holding longer never lowers
    a peak): the least peak within ``compute``."""
    choices = []
    for t in range(graph.num_stages + 1):
        fixed = set(graph.members[t]) | (set(graph.forward_outputs) if t == 0 else set())
        optional = [i for i in _computable(graph, t) if i not in fixed]
        subsets = itertools.chain.from_iterable(itertools.combinations(optional, r) for r in range(len(optional) + 1))
        choices.append([frozenset(fixed | set(s)) for s in subsets])
    best = None
    for computed in itertools.product(*choices):
        schedule = Schedule(tuple(computed), _held_until_last_read(graph, [set(c) for c in computed]))
        try:
            cost = evaluate_schedule(graph, schedule)
        except InvalidSchedule:
            continue
        if (compute is None or cost.compute_seconds <= compute) and (best is None or cost.peak_bytes < best):
            best = cost.peak_bytes
    return best


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.booleans())
def test_milp_matches_brute_force_and_beats_every_plan(seed, forward, backward, bounded, kept):
    rng = random.Random(seed)
    graph = random_graph(rng, forward, backward, kept)
    plans = {}
    for r in range(forward + 1):
        for saved in itertools.combinations(graph.forward_nodes, r):
            try:
                plans[saved] = evaluate_plan(graph, saved)
            except ValueError:
                continue  # saves too little: a node that may not be recomputed
    compute = min(p.compute_seconds for p in plans.values()) if bounded else None
    solution = solve_min_peak(graph, compute, time_limit=20)
    assert solution.optimal
    assert solution.peak_bytes == brute_force_min_peak(graph, compute)
    for cost in plans.values():
        if compute is None or cost.compute_seconds <= compute:
            assert solution.peak_bytes <= cost.peak_bytes


def test_solver_module_does_not_import_torch():
    code = "import sys, fxremat_passes.solver.peak_milp; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def multi_output() -> ScheduleGraph:
    """x -> op (SDPA-like: no bytes of its own, its two items while it runs) -> items a (1 byte), b (2 bytes) ->
    y (the output, reads both); backward: gy reads a, gx reads gy and b."""
    #            x     op    a     b     y       t     gy      gx
    inputs = ((), (0,), (1,), (1,), (2, 3), (), (5, 2), (6, 3))
    return ScheduleGraph(
        nbytes=(0, 0, 1, 2, 1, 0, 1, 1),
        compute_seconds=(0.0, 4.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0),
        inputs=inputs,
        backward=(False,) * 5 + (True,) * 3,
        required=(4, 7),
        free=(True, False, False, False, False, True, False, False),
        transient_bytes=(0, 3, 0, 0, 0, 0, 0, 0),
        holdable=(True, False, True, True, True, True, True, True),
    )


def test_a_multi_output_op_makes_every_item_backward_needs_where_it_runs():
    graph = multi_output()
    # save a only: gx needs b, so the op runs again in gx's stage, with b; gy's stage needs only a
    schedule = plan_schedule(graph, (2,))
    assert schedule.computed[1] == {6} and schedule.computed[2] == {1, 3, 7} and schedule.held[2] == {6}
    # gx's stage: gy held (1), the op (its items while it runs: 3 more), b (2), gx (1): 4 at the op and at gx;
    # forward: the op (3), a, b, y (a, b, y: 4)
    assert evaluate_schedule(graph, schedule).peak_bytes == 4
    with pytest.raises(InvalidSchedule, match="cannot be held"):
        evaluate_schedule(graph, Schedule(schedule.computed, (frozenset(), frozenset({1, 2}), frozenset({1, 6}))))
    solution = solve_min_peak(graph, None, time_limit=20)
    assert solution.optimal and all(1 not in held for held in solution.schedule.held)
