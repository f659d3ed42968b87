"""The min-cut solver against brute force and networkx, on literal, generated and random problems.

No torch import here: the solver works on plain integers (a test below checks that importing it pulls no torch).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxremat_passes.solver.mincut import (
    CAPACITY_LIMIT,
    CutProblem,
    InfeasibleCutError,
    check_plan,
    plan_cost,
    solve_min_cut,
)


def brute_force(problem: CutProblem) -> int | None:
    """Cheapest valid plan by enumeration: each value is forward-only, saved, or recomputed."""
    best = None
    for states in itertools.product((0, 1, 2), repeat=problem.num_values):
        saved = [v for v, s in enumerate(states) if s == 1]
        recomputed = [v for v, s in enumerate(states) if s == 2]
        if check_plan(problem, saved, recomputed):
            continue
        cost = plan_cost(problem, saved, recomputed)
        if cost is not None and (best is None or cost < best):
            best = cost
    return best


def networkx_cut_value(problem: CutProblem) -> float:
    g = nx.DiGraph()
    g.add_node("s")
    g.add_node("t")
    for v in range(problem.num_values):
        s, r = problem.save_cost[v], problem.recompute_cost[v]
        g.add_edge(("in", v), ("out", v), capacity=float("inf") if s is None else s)
        if r is None or r > 0:
            g.add_edge("s", ("in", v), capacity=float("inf") if r is None else r)
    for u, w in problem.edges:
        g.add_edge(("out", u), ("in", w), capacity=float("inf"))
    for v in problem.needed:
        g.add_edge(("out", v), "t", capacity=float("inf"))
    value, _ = nx.minimum_cut(g, "s", "t")
    return value


def random_problem(rng: random.Random, n: int, p_edge: float, p_inf: float, max_cost: int) -> CutProblem:
    def cost():
        return None if rng.random() < p_inf else rng.randint(0, max_cost)

    edges = tuple((u, w) for w in range(n) for u in range(w) if rng.random() < p_edge)
    # value 0 is an input: cannot be recomputed, free to save, so every problem has a valid plan
    save = [0] + [cost() for _ in range(n - 1)]
    recompute = [None] + [cost() for _ in range(n - 1)]
    needed = tuple(sorted(rng.sample(range(n), k=rng.randint(1, max(1, n // 2)))))
    # make it feasible: a value that is needed but can be neither saved nor recomputed becomes saveable
    for v in needed:
        if save[v] is None and recompute[v] is None:
            save[v] = rng.randint(0, max_cost)
    return CutProblem(n, tuple(save), tuple(recompute), edges, needed)


# --- literal cases -----------------------------------------------------------------------------------------


def test_chain_prefers_recomputing_cheap_tail():
    # input(0) -> a(1) -> b(2); backward reads b. Saving b costs 10, recomputing a and b costs 1 + 1.
    problem = CutProblem(3, (0, 10, 10), (None, 1, 1), ((0, 1), (1, 2)), (2,))
    sol = solve_min_cut(problem)
    assert sol.saved == (0,)
    assert sol.recomputed == (1, 2)
    assert sol.cut_value == 2


def test_chain_prefers_saving_when_recompute_is_expensive():
    problem = CutProblem(3, (0, 10, 3), (None, 100, 1), ((0, 1), (1, 2)), (2,))
    sol = solve_min_cut(problem)
    assert sol.saved == (2,)
    assert sol.recomputed == ()
    assert sol.cut_value == 3


def test_banned_node_is_saved_not_recomputed():
    # a(1) is banned (random op); b(2) = f(a) is cheap; backward needs b.
    problem = CutProblem(3, (0, 50, 60), (None, None, 1), ((0, 1), (1, 2)), (2,))
    sol = solve_min_cut(problem)
    assert 1 not in sol.recomputed
    assert sol.saved == (1,) and sol.recomputed == (2,)


def test_unsaveable_tuple_forces_saving_its_items():
    # tuple(1) cannot be saved (None) nor recomputed (banned); its item(2) costs 0 to recompute from the tuple.
    problem = CutProblem(3, (0, None, 7), (None, None, 0), ((0, 1), (1, 2)), (2,))
    sol = solve_min_cut(problem)
    assert sol.saved == (2,)
    assert sol.cut_value == 7


def test_shared_input_counted_once():
    # x(1) feeds two cheap values that backward needs; recomputing both from a saved x beats saving both.
    problem = CutProblem(4, (0, 5, 4, 4), (None, 100, 1, 1), ((0, 1), (1, 2), (1, 3)), (2, 3))
    sol = solve_min_cut(problem)
    assert sol.saved == (1,)
    assert sol.recomputed == (2, 3)
    assert sol.cut_value == 7


def test_infeasible_problem_names_the_chain():
    problem = CutProblem(2, (0, None), (None, None), ((0, 1),), (1,))
    with pytest.raises(InfeasibleCutError) as info:
        solve_min_cut(problem)
    assert 1 in info.value.path


def test_no_needed_values_is_an_empty_plan():
    sol = solve_min_cut(CutProblem(2, (0, 1), (None, 1), ((0, 1),), ()))
    assert sol.saved == () and sol.recomputed == () and sol.cut_value == 0


def test_capacity_overflow_is_refused_not_truncated():
    problem = CutProblem(2, (0, CAPACITY_LIMIT), (None, 1), ((0, 1),), (1,))
    with pytest.raises(ValueError, match="int32"):
        solve_min_cut(problem)


@pytest.mark.parametrize(
    "bad",
    [
        dict(num_values=2, save_cost=(0,), recompute_cost=(None, 1), edges=(), needed=()),
        dict(num_values=2, save_cost=(0, -1), recompute_cost=(None, 1), edges=(), needed=()),
        dict(num_values=2, save_cost=(0, 1.5), recompute_cost=(None, 1), edges=(), needed=()),
        dict(num_values=2, save_cost=(0, 1), recompute_cost=(None, 1), edges=((0, 2),), needed=()),
        dict(num_values=2, save_cost=(0, 1), recompute_cost=(None, 1), edges=(), needed=(5,)),
    ],
)
def test_malformed_problems_are_rejected(bad):
    with pytest.raises(ValueError):
        CutProblem(**bad)


# --- generated chains and diamonds --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2, 5, 20, 200])
def test_long_chain_matches_closed_form(length):
    # input -> v1 -> ... -> vL, backward needs vL; each save costs 10, each recompute 1.
    n = length + 1
    problem = CutProblem(
        n, (0,) + (10,) * length, (None,) + (1,) * length, tuple((i, i + 1) for i in range(length)), (length,)
    )
    sol = solve_min_cut(problem)
    assert sol.cut_value == min(10, length)  # save the last, or recompute the whole chain from the input
    assert not check_plan(problem, sol.saved, sol.recomputed)


def test_diamond():
    #   0 -> 1 -> {2, 3} -> 4 ; backward needs 4 and 2
    problem = CutProblem(5, (0, 8, 6, 6, 9), (None, 5, 1, 1, 1), ((0, 1), (1, 2), (1, 3), (2, 4), (3, 4)), (2, 4))
    sol = solve_min_cut(problem)
    assert sol.cut_value == brute_force(problem)
    assert not check_plan(problem, sol.saved, sol.recomputed)


# --- random problems: brute force and networkx as oracles --------------------------------------------------


@pytest.mark.parametrize("seed", range(150))
def test_random_small_against_brute_force(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, n=rng.randint(2, 7), p_edge=0.4, p_inf=0.2, max_cost=9)
    expected = brute_force(problem)
    try:
        sol = solve_min_cut(problem)
    except InfeasibleCutError:
        assert expected is None
        return
    assert sol.cut_value == expected
    assert not check_plan(problem, sol.saved, sol.recomputed)


@pytest.mark.parametrize("seed", range(40))
def test_random_large_against_networkx(seed):
    rng = random.Random(1000 + seed)
    problem = random_problem(rng, n=rng.randint(20, 200), p_edge=0.05, p_inf=0.1, max_cost=10_000)
    try:
        sol = solve_min_cut(problem)
    except InfeasibleCutError:
        with pytest.raises(nx.NetworkXUnbounded):
            networkx_cut_value(problem)
        return
    assert sol.cut_value == networkx_cut_value(problem)
    assert not check_plan(problem, sol.saved, sol.recomputed)


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(2, 40))
    return random_problem(random.Random(seed), n, p_edge=draw(st.floats(0.0, 0.5)), p_inf=0.15, max_cost=1000)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_invariants(problem):
    """The plan is valid, banned values are never recomputed, unsaveable ones never saved, and it is
    deterministic."""
    try:
        sol = solve_min_cut(problem)
    except InfeasibleCutError:
        return
    assert not check_plan(problem, sol.saved, sol.recomputed)
    assert all(problem.recompute_cost[v] is not None for v in sol.recomputed)
    assert all(problem.save_cost[v] is not None for v in sol.saved)
    assert list(sol.saved) == sorted(sol.saved) and list(sol.recomputed) == sorted(sol.recomputed)
    again = solve_min_cut(problem)
    assert (again.saved, again.recomputed) == (sol.saved, sol.recomputed)


def test_solver_module_does_not_import_torch():
    code = "import sys, fxremat_passes.solver.mincut; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_solvers_import_scipy_on_their_first_solve_not_before():
    # a compile that Inductor's cache answers never solves, so it must not pay for scipy's import (issue #16)
    code = (
        "import sys, fxremat_passes.solver.mincut, fxremat_passes.solver.milp, fxremat_passes.solver.peak_milp\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'scipy'], 'scipy imported'\n"
        "from fxremat_passes.solver.mincut import CutProblem, solve_min_cut\n"
        "solution = solve_min_cut(CutProblem(num_values=1, edges=(), needed=(0,), save_cost=(1,), "
        "recompute_cost=(None,)))\n"
        "assert solution.saved == (0,) and 'scipy.sparse.csgraph' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the vectorised parts of a solve (benchmarks/RESULTS.md, "Partition time, session 24") ---------------------------


def walked_value_by_value(problem: CutProblem, in_forward: set[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The demand walk as the solver made it before: from the needed values, through the inputs of every value
    computed in backward; a value computed in forward is saved and not walked through."""
    preds: list[list[int]] = [[] for _ in range(problem.num_values)]
    for u, w in problem.edges:
        preds[w].append(u)
    saved, recomputed, seen, stack = set(), set(), set(), list(problem.needed)
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            if v in in_forward:
                saved.add(v)
            else:
                recomputed.add(v)
                stack.extend(preds[v])
    return tuple(sorted(saved)), tuple(sorted(recomputed))


@pytest.mark.parametrize("seed", range(40))
def test_the_demand_walk_is_the_value_by_value_walk(seed):
    from fxremat_passes.solver.mincut import _demanded, v_in

    rng = random.Random(seed)
    problem = random_problem(rng, rng.randint(1, 40), rng.choice((0.05, 0.2, 0.5)), 0.2, 9)
    in_forward = {v for v in range(problem.num_values) if rng.random() < 0.5}
    reachable = np.zeros(2 + 2 * problem.num_values, dtype=bool)
    reachable[[v_in(v) for v in in_forward]] = True
    assert _demanded(problem, reachable) == walked_value_by_value(problem, in_forward)


def solved(problem: CutProblem):
    try:
        return dataclasses.replace(solve_min_cut(problem), solve_seconds=0.0)
    except InfeasibleCutError as error:
        return error.path


@pytest.mark.parametrize("seed", range(20))
def test_a_problem_of_arrays_is_the_problem_of_its_tuples(seed):
    from fxremat_passes.solver.mincut import INFINITE

    problem = random_problem(random.Random(seed), 30, 0.2, 0.2, 9)
    save, recompute = problem.cost_arrays
    made = CutProblem.of_arrays(save.copy(), recompute.copy(), problem.edges, problem.needed)
    assert made == problem and all(type(c) is int for c in made.save_cost + made.recompute_cost if c is not None)
    assert all((a == b).all() for a, b in zip(made.cost_arrays, problem.cost_arrays))
    assert solved(made) == solved(problem)
    with pytest.raises(ValueError, match="save_cost"):
        CutProblem.of_arrays(np.full(3, INFINITE - 1), np.zeros(3, dtype=np.int64), (), (0,))
    with pytest.raises(ValueError, match="recompute_cost"):
        CutProblem.of_arrays(np.zeros(3, dtype=np.int64), np.zeros(3), (), (0,))
