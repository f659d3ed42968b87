"""The user's plan on plain-number problems (no torch): tagged values are forced to recompute where they can be."""

from __future__ import annotations

import dataclasses

import pytest

from fxremat_passes.solver.budget import solve_at
from fxremat_passes.solver.parametric import ParametricProblem
from fxremat_passes.solver.user_plan import force_recompute


def chain(recompute, traffic=None, needed=(1, 2, 3)) -> ParametricProblem:
    """x (input, 0) -> a (1) -> b (2) -> c (3), each 1 KiB, backward reads ``needed``; keeping is cheap (traffic
    1 ns), recomputing dear (1 ms), so the plain cut keeps everything backward reads."""
    n = len(recompute)
    return ParametricProblem(
        num_values=n,
        storage=(-1, *range(n - 1)),
        storage_bytes=(1024,) * (n - 1),
        traffic_seconds=traffic or (0.0,) + (1e-9,) * (n - 1),
        save_scale=(1.0,) * n,
        recompute_seconds=recompute,
        edges=tuple((v, v + 1) for v in range(n - 1)),
        needed=needed,
    )


def test_tagged_values_are_recomputed_and_untagged_ones_priced_as_usual():
    problem = chain((None, 1e-3, 1e-3, 1e-3))
    assert solve_at(problem, 1e-12).saved == (1, 2, 3)
    forced = force_recompute(problem, {1, 2})
    assert forced.forced == {1, 2} and not forced.unforced
    plan = solve_at(forced.problem, 1e-12)
    assert plan.saved == (0, 3) and set(plan.recomputed) == {1, 2}  # rebuilt from the input; c is not tagged
    assert problem.saved_bytes(plan.saved) < problem.saved_bytes(solve_at(problem, 1e-12).saved)


def test_a_tagged_value_that_cannot_be_recomputed_stays_saveable():
    # b (2) is tagged but may never be recomputed (a random op, say): it stays saveable; c (3), tagged, is forced
    problem = chain((None, 1e-3, None, 1e-3))
    forced = force_recompute(problem, {2, 3})
    assert forced.unforced == {2} and forced.forced == {3}
    plan = solve_at(forced.problem, 1e-12)
    assert 2 in plan.saved and 3 in plan.recomputed


def test_forcing_follows_unsaveable_inputs():
    # a (1) cannot be saved (traffic None) nor recomputed: b (2), tagged, cannot be rebuilt, so it stays saveable
    problem = chain((None, None, 1e-3, 1e-3), traffic=(0.0, None, 1e-9, 1e-9), needed=(2, 3))
    forced = force_recompute(problem, {2, 3})
    assert forced.unforced == {2} and forced.forced == {3}
    assert 2 in solve_at(forced.problem, 1e-12).saved


def test_edges_out_of_graph_order_are_refused():
    problem = chain((None, 1e-3, 1e-3, 1e-3))
    reversed_edges = dataclasses.replace(problem, edges=((2, 1),))
    with pytest.raises(ValueError, match="graph order"):
        force_recompute(reversed_edges, {1})
