"""The solvers a user names with ``fxremat.backend(solver=...)`` (no torch): each takes a ``ParametricProblem``, the
price of memory, a ``SolveCache`` and, under a budget, a saved-bytes target, and returns a ``Plan``.

``SOLVERS`` maps each name to its implementation; ``fxremat/options.py`` validates ``solver=`` against its names and
plan choice (``passes/choice/``: ``plan.py``, ``default.py``, ``memory_budget.py``, ``regions.py``) dispatches
through it.  A new solver is
a class here with the three attributes and two methods of ``Solver``, and one ``register`` line.

* ``"mincut"``: the cut at the price (one max-flow, ``budget.solve_at``); under a budget the price search
  (``budget.search_budget``), refined by the exact MILP on graphs up to ``MILP_REFINE_LIMIT`` values.
* ``"milp"``: the exact MILP for every plan (``milp.py``): small graphs only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from .budget import BudgetResult, Plan, SolveCache, search_budget
from .milp import MILP_NODE_LIMIT, MilpFailed, objective, solve_milp
from .parametric import ParametricProblem

log = logging.getLogger(__name__)

# Refine a budget plan with the exact MILP up to this many values, within ``milp.MILP_NODE_LIMIT`` branch-and-bound
# nodes (HiGHS returns its best plan so far at the limit; no wall-clock limit, so the plan does not depend on the
# machine's load); above it the Lagrangian plan stands.  Why refine at all, and why these sizes: docs/DESIGN.md
# §5.1 and §13 (benchmarks/investigations/milp_gap.py, benchmarks/solve_time.py's 48 blocks).
MILP_REFINE_LIMIT = 20_000


@dataclass(frozen=True)
class Budget:
    """A saved-bytes budget as a solver sees it: the target, and the plans at its two ends."""

    target: int  # saved bytes
    max_price: float  # the price standing for infinity (seconds per byte)
    default: Plan  # the solver's plan without a budget
    fewest: Plan  # the fewest-bytes plan (the cut at ``max_price``)


class Solver(Protocol):
    name: str
    # exact: the plan is the MILP's optimum; per-region budgets (region_search.solve_regions) run the MILP alone
    exact: bool
    # peak_judged: memory_budget chooses among the price search's candidates by simulated step peak and the default
    # plan may save the block sums (passes/choice/memory_budget.py, default.py); otherwise this solver's plan stands
    peak_judged: bool

    def default(self, problem: ParametricProblem, price: float, cache: SolveCache) -> Plan:
        """The plan without a budget."""
        ...

    def within(self, problem: ParametricProblem, price: float, budget: Budget, cache: SolveCache) -> tuple[Plan, bool]:
        """The plan within ``budget.target`` saved bytes, and whether the budget was met (if not: a plan over it,
        the fewest-bytes one where nothing fits)."""
        ...


def cheapest_within(
    problem: ParametricProblem, price: float, budget: Budget, cache: SolveCache | None = None
) -> tuple[Plan, bool]:
    """The price search's plan within ``budget.target`` saved bytes, refined by the MILP on graphs small enough;
    and whether the budget was met (if not: the fewest-bytes plan)."""
    result = _searched(problem, price, budget, cache)
    plan = _refine(problem, result.plan, price, budget.target) if _refines(problem, result) else result.plan
    return plan, result.budget_met


def _searched(problem: ParametricProblem, price: float, budget: Budget, cache: SolveCache | None) -> BudgetResult:
    """The price search from ``price`` within ``budget`` (``budget.search_budget``)."""
    b = budget
    return search_budget(
        problem, b.target, price, b.max_price, default_plan=b.default, fewest_bytes_plan=b.fewest, cache=cache
    )


def _refines(problem: ParametricProblem, searched: BudgetResult) -> bool:
    """Whether the MILP refines the price search's plan: a budget met by another plan than the default, on a graph
    small enough."""
    small = problem.num_values <= MILP_REFINE_LIMIT
    return searched.budget_met and searched.plan is not searched.default_plan and small


def cheapest_within_each(
    problem: ParametricProblem, price: float, budgets: list[Budget], cache: SolveCache
) -> list[tuple[Plan, float]]:
    """(``cheapest_within(...)[0]``, its MILP's dual bound or -inf: ``milp.solve_milp``) for each budget:
    the price searches in turn (they share ``cache``: the same solves, in the same order, as one call per target),
    then the MILP refinements all at once, one thread each.  HiGHS runs without holding the GIL, each calling
    thread with a scheduler of its own, and a refinement reads nothing the others write, so the plans are the ones
    made in turn; at 48 blocks the refinements are about half of the memory_budget partition's CPU seconds, and
    this way take the wall time of the slowest where cores are free (CPU seconds unchanged)."""
    from concurrent.futures import ThreadPoolExecutor

    searched = [_searched(problem, price, b, cache) for b in budgets]
    targets = [b.target for b in budgets]
    refined = [_refines(problem, r) for r in searched]
    unrefined = [(r.plan, float("-inf")) for r in searched]
    if sum(refined) < 2:
        return [
            _refine_bounded(problem, r.plan, price, t) if ok else u
            for r, t, ok, u in zip(searched, targets, refined, unrefined)
        ]
    with ThreadPoolExecutor(max_workers=sum(refined), thread_name_prefix="fxremat-milp") as pool:
        futures = [
            pool.submit(_refine_bounded, problem, r.plan, price, t) if ok else None
            for r, t, ok in zip(searched, targets, refined)
        ]
        return [f.result() if f is not None else u for f, u in zip(futures, unrefined)]


def _refine(problem: ParametricProblem, plan: Plan, price: float, target: int) -> Plan:
    """Close the Lagrangian gap with the exact MILP; keep whichever plan is cheaper and within the budget."""
    return _refine_bounded(problem, plan, price, target)[0]


def _refine_bounded(problem: ParametricProblem, plan: Plan, price: float, target: int) -> tuple[Plan, float]:
    """(``_refine``'s plan, the MILP's dual bound, or -inf where it failed)."""
    try:
        exact, dual = solve_milp(problem, price, target, node_limit=MILP_NODE_LIMIT)
    except MilpFailed as error:
        log.debug("MILP refinement failed: %s", error)
        return plan, float("-inf")
    if exact.saved_bytes <= target and objective(problem, exact, price) < objective(problem, plan, price):
        return exact, dual
    return plan, dual


class MinCut:
    name, exact, peak_judged = "mincut", False, True

    def default(self, problem: ParametricProblem, price: float, cache: SolveCache) -> Plan:
        return cache.at(price)

    def within(self, problem: ParametricProblem, price: float, budget: Budget, cache: SolveCache) -> tuple[Plan, bool]:
        return cheapest_within(problem, price, budget, cache)


class Milp:
    name, exact, peak_judged = "milp", True, False

    def default(self, problem: ParametricProblem, price: float, cache: SolveCache) -> Plan:
        return solve_milp(problem, price, None).plan

    def within(self, problem: ParametricProblem, price: float, budget: Budget, cache: SolveCache) -> tuple[Plan, bool]:
        try:
            return solve_milp(problem, price, budget.target).plan, True
        except MilpFailed:
            return budget.fewest, budget.fewest.saved_bytes <= budget.target


SOLVERS: dict[str, Solver] = {}


def register(solver: Solver) -> Solver:
    SOLVERS[solver.name] = solver
    return solver


register(MinCut())
register(Milp())
