"""The solver registry (passes/solver/solvers.py) on plain-number problems (no torch): every registered solver keeps a
budget it says it met, and plans the graph can run."""

from __future__ import annotations

import random
import subprocess
import sys
import threading

import pytest
from test_budget import DEFAULT_PRICE, MAX_PRICE, feasible, random_parametric

from fxremat_passes.solver import solvers
from fxremat_passes.solver.budget import SolveCache, budget_target
from fxremat_passes.solver.mincut import check_plan
from fxremat_passes.solver.solvers import SOLVERS, Budget, cheapest_within, cheapest_within_each


def test_the_registry_names_each_solver_by_its_own_name():
    assert {"mincut", "milp"} <= set(SOLVERS)
    assert all(name == solver.name for name, solver in SOLVERS.items())
    assert not SOLVERS["mincut"].exact and SOLVERS["mincut"].peak_judged
    assert SOLVERS["milp"].exact and not SOLVERS["milp"].peak_judged


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("seed", range(8))
def test_every_solver_meets_the_budgets_it_says_it_met(name, seed):
    problem = random_parametric(random.Random(seed), 14, shared_storage=True)
    if not feasible(problem):
        return
    solver, cache = SOLVERS[name], SolveCache(problem)
    default, fewest = solver.default(problem, DEFAULT_PRICE, cache), cache.at(MAX_PRICE)
    assert not check_plan(problem.at(DEFAULT_PRICE)[0], default.saved, default.recomputed)
    for fraction in (0.0, 0.3, 0.7):
        target = budget_target(fraction, default.saved_bytes, fewest.saved_bytes)
        plan, met = solver.within(problem, DEFAULT_PRICE, Budget(target, MAX_PRICE, default, fewest), cache)
        assert not met or plan.saved_bytes <= target
        assert not check_plan(problem.at(DEFAULT_PRICE)[0], plan.saved, plan.recomputed)


def test_a_fractional_budget_runs_from_the_fewest_to_the_default_and_bytes_are_bytes():
    assert [budget_target(f, 1000, 200) for f in (0.0, 1.0, 0.5)] == [200, 1000, 600]
    assert budget_target(0.5, 100, 300) == 300  # a default below the fewest: the fewest
    assert budget_target(4096, 1000, 200) == 4096


@pytest.mark.parametrize("seed", range(8))
def test_the_refinements_made_at_once_are_the_ones_made_in_turn_and_run_on_threads_of_their_own(seed, monkeypatch):
    problem = random_parametric(random.Random(seed), 14, shared_storage=True)
    if not feasible(problem):
        return
    default, fewest = SolveCache(problem).at(DEFAULT_PRICE), SolveCache(problem).at(MAX_PRICE)
    targets = [budget_target(f, default.saved_bytes, fewest.saved_bytes) for f in (0.75, 0.5, 0.25, 0.1)]
    cache = SolveCache(problem)
    budgets = [Budget(t, MAX_PRICE, default, fewest) for t in targets]
    in_turn = [cheapest_within(problem, DEFAULT_PRICE, b, cache)[0] for b in budgets]
    threads, refine = [], solvers._refine_bounded

    def recorded(*args):
        threads.append(threading.current_thread().name)
        return refine(*args)

    monkeypatch.setattr(solvers, "_refine_bounded", recorded)
    cache = SolveCache(problem)
    at_once = cheapest_within_each(problem, DEFAULT_PRICE, budgets, cache)
    assert [plan for plan, _ in at_once] == in_turn
    assert len(threads) < 2 or all(name.startswith("fxremat-milp") for name in threads)


def test_a_refinement_stops_at_a_node_limit_so_its_plan_does_not_depend_on_the_load(monkeypatch):
    """A time limit made the refined plan depend on how many nodes HiGHS reached before it (T5 under load; GPT-2's
    refinements at GPU shapes, six threads on a loaded machine): only the node limit stops it, and HiGHS is
    deterministic up to it."""
    import scipy.optimize

    problem = next(p for seed in range(20) if feasible(p := random_parametric(random.Random(seed), 14)))
    default, fewest = SolveCache(problem).at(DEFAULT_PRICE), SolveCache(problem).at(MAX_PRICE)
    target = budget_target(0.5, default.saved_bytes, fewest.saved_bytes)
    options = _recorded_milp_options(monkeypatch, scipy.optimize)
    first = solvers._refine_bounded(problem, fewest, DEFAULT_PRICE, target)
    assert options == [{"node_limit": solvers.MILP_NODE_LIMIT}]
    assert solvers._refine_bounded(problem, fewest, DEFAULT_PRICE, target) == first


def test_no_solve_of_the_solver_tier_has_a_wall_clock_limit(monkeypatch):
    """The exact solver and the per-region MILP stop at a node count too, never at a time."""
    import scipy.optimize

    from fxremat_passes.solver.milp import EXACT_NODE_LIMIT, MILP_NODE_LIMIT
    from fxremat_passes.solver.region_search import Region, solve_regions

    problem = next(p for seed in range(20) if feasible(p := random_parametric(random.Random(seed), 14)))
    options = _recorded_milp_options(monkeypatch, scipy.optimize)
    cache = SolveCache(problem)
    default, fewest = SOLVERS["milp"].default(problem, DEFAULT_PRICE, cache), cache.at(MAX_PRICE)
    target = budget_target(0.5, default.saved_bytes, fewest.saved_bytes)
    SOLVERS["milp"].within(problem, DEFAULT_PRICE, Budget(target, MAX_PRICE, default, fewest), cache)
    region = Region(tuple(range(len(problem.storage_bytes))), 0.5)
    solve_regions(problem, [region], DEFAULT_PRICE, MAX_PRICE, exact=True)
    solve_regions(problem, [region], DEFAULT_PRICE, MAX_PRICE, exact=True, exact_only=True)
    assert options and all(set(o) == {"node_limit"} for o in options)
    assert {o["node_limit"] for o in options} <= {EXACT_NODE_LIMIT, MILP_NODE_LIMIT}


def _recorded_milp_options(monkeypatch, scipy_optimize) -> list[dict]:
    """The options of every scipy ``milp`` call from now on, as the caller passed them."""
    options, milp = [], scipy_optimize.milp

    def recorded(*args, **kwargs):
        options.append(dict(kwargs["options"]))  # scipy pops what it reads
        return milp(*args, **kwargs)

    monkeypatch.setattr(scipy_optimize, "milp", recorded)
    return options


def test_the_registry_does_not_import_torch():
    code = "import sys, fxremat_passes.solver.solvers; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
