"""Budgets over the weighted cut (no torch): the cheapest plan whose saved bytes fit, and the memory/time frontier.

The plan at price ``p`` minimises ``time + p * bytes`` (one max-flow).  Its saved bytes are non-increasing in
``p`` (the Lagrangian argument; the solver breaks ties deterministically), so a log-space bisection finds the
smallest price whose plan fits a budget.  The plans found that way are the vertices of the lower convex hull of the
(bytes, time) frontier; a budget between two vertices is met by the vertex below it, which may be slower than
necessary (the Lagrangian gap).  ``refine`` closes that gap with the exact MILP when the graph is small enough
(``milp.py``), and never returns a plan over budget.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from .mincut import solve_min_cut
from .parametric import ParametricProblem

log = logging.getLogger(__name__)

# Bisection stops when the bracket of prices is this tight (ratio): plans change at a handful of prices per model
# (a few distinct cuts across two decades of price: ``benchmarks/frontier.py``), so 1% finds each breakpoint.
PRICE_RESOLUTION = 1.01
MAX_SOLVES = 60


@dataclass(frozen=True)
class Plan:
    price: float  # seconds per byte at which this plan is optimal (nan for a refined plan)
    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    saved_bytes: int
    seconds: float  # traffic + recompute, estimated: what the plan adds to a step
    method: str = "mincut"
    recompute_seconds: float = 0.0  # the recompute part alone


def budget_target(budget: float | int, default: int, fewest: int) -> int:
    """A budget in bytes: a float ``f`` in [0, 1] is ``fewest + f * (default - fewest)`` (0.0 the fewest, 1.0 the
    default; docs/DESIGN.md §5.1), an int is itself.  The one reading of a fractional budget: of a graph's saved
    bytes (``passes/choice/plan.py``), of one region's (``region_search.py``) and of a step's simulated peak
    (``passes/choice/peak.py``, where ``fewest`` is the lowest peak)."""
    if isinstance(budget, float):
        return int(fewest + budget * max(0, default - fewest))
    return int(budget)


def _positive(price: float, high: float) -> float:
    """Bisect in log space: a price of 0 stands in as a tiny positive one."""
    return price if price > 0 else high * 1e-12


def solve_at(problem: ParametricProblem, price: float) -> Plan:
    cut, _ = problem.at(price)
    solution = solve_min_cut(cut)
    return Plan(
        price=price,
        saved=solution.saved,
        recomputed=solution.recomputed,
        saved_bytes=problem.saved_bytes(solution.saved),
        seconds=problem.seconds(solution.saved, solution.recomputed),
        recompute_seconds=problem.recompute_seconds_of(solution.recomputed),
    )


class SolveCache:
    """The plans of one problem by price, for every search over it to share.  Saved bytes are non-increasing in the
    price, so the prices solved so far bracket any new budget: a sweep of budgets solves only near breakpoints it
    has not seen yet (48 stacked blocks: 209 max-flows for 20 budgets without it)."""

    def __init__(self, problem: ParametricProblem):
        self.problem = problem
        self.plans: dict[float, Plan] = {}

    def at(self, price: float) -> Plan:
        plan = self.plans.get(price)
        if plan is None:
            plan = self.plans[price] = solve_at(self.problem, price)
        return plan

    def bracket(self, budget_bytes: int, low: float, high: float) -> tuple[float, float, Plan | None]:
        """(low, high) narrowed to the solved prices around the budget's threshold, and the plan at high if solved."""
        best = None
        for price, plan in self.plans.items():
            if low < price < high:
                if plan.saved_bytes <= budget_bytes:
                    high, best = price, plan
                else:
                    low = price
            elif price == high:
                best = plan
        return low, high, best


@dataclass(frozen=True)
class BudgetResult:
    plan: Plan
    budget_bytes: int
    budget_met: bool
    default_plan: Plan
    fewest_bytes_plan: Plan
    solves: int
    seconds: float


def search_budget(
    problem: ParametricProblem,
    budget_bytes: int,
    default_price: float,
    max_price: float,
    *,
    default_plan: Plan | None = None,
    fewest_bytes_plan: Plan | None = None,
    cache: SolveCache | None = None,
) -> BudgetResult:
    """The plan at the smallest price in [default_price, max_price] whose saved bytes fit ``budget_bytes`` (to
    ``PRICE_RESOLUTION``).  With a ``cache`` shared by several searches, prices already solved narrow the bisection
    first; the plans stay monotone in the budget (a smaller budget's threshold bracket lies above a larger one's)."""
    start = time.perf_counter()
    cache = cache if cache is not None else SolveCache(problem)
    solved_before = len(cache.plans)

    def result(plan: Plan, met: bool) -> BudgetResult:
        return BudgetResult(
            plan,
            budget_bytes,
            met,
            default_plan,
            fewest_bytes_plan or default_plan,
            len(cache.plans) - solved_before,
            time.perf_counter() - start,
        )

    if default_plan is None:
        default_plan = cache.at(default_price)
    if default_plan.saved_bytes <= budget_bytes:
        return result(default_plan, True)
    if fewest_bytes_plan is None:
        fewest_bytes_plan = cache.at(max_price)
    if fewest_bytes_plan.saved_bytes > budget_bytes:
        return result(fewest_bytes_plan, False)
    lo, hi, best = cache.bracket(budget_bytes, _positive(default_price, max_price), max_price)
    best = best or fewest_bytes_plan
    while hi / lo > PRICE_RESOLUTION and len(cache.plans) - solved_before < MAX_SOLVES:
        mid = math.sqrt(lo * hi)
        plan = cache.at(mid)
        if plan.saved_bytes <= budget_bytes:
            hi, best = mid, plan
        else:
            lo = mid
    return result(best, True)


def frontier(
    problem: ParametricProblem,
    low_price: float,
    high_price: float,
    max_solves: int = 40,
    cache: SolveCache | None = None,
) -> list[Plan]:
    """The distinct plans between two prices (lower convex hull vertices of bytes vs time), fewest solves first:
    split a price interval only while its two ends give different plans."""
    cache = cache if cache is not None else SolveCache(problem)
    ends = [cache.at(low_price), cache.at(high_price)]
    plans = {(p.saved, p.recomputed): p for p in ends}
    stack = [(ends[0], ends[1])]
    solves = 2
    while stack and solves < max_solves:
        a, b = stack.pop()
        low = _positive(a.price, b.price)
        if a.saved_bytes == b.saved_bytes or b.price / low <= PRICE_RESOLUTION:
            continue
        mid = cache.at(math.sqrt(low * b.price))
        solves += 1
        plans.setdefault((mid.saved, mid.recomputed), mid)
        stack.append((a, mid))
        stack.append((mid, b))
    distinct: dict[int, Plan] = {}
    for plan in sorted(plans.values(), key=lambda p: p.price):
        distinct.setdefault(plan.saved_bytes, plan)  # the cheapest-price plan per byte count
    return sorted(distinct.values(), key=lambda p: -p.saved_bytes)
