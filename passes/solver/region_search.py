"""Per-region budgets over one cut (no torch): each region, a set of storages, keeps at most its own bytes, in one
solve with the rest of the graph.

A region's budget is a fraction ``f`` of the way from what the region keeps in the fewest-bytes plan to what it
keeps in the default plan, as one budget for a whole graph is (``budget.budget_target``), or a number of bytes.
The fewest-bytes plan here prices every region's storages at the top price and the others at the default price;
storages outside every region keep the default price throughout.

Two solvers, as for one budget (``budget.py``, ``milp.py``):

* the cut, with one price of memory per region: a coordinate search.  With the other prices fixed, a region's
  saved bytes are non-increasing in its own price (``budget.py``'s Lagrangian argument, restricted to that region's
  bytes).  Raising one region's price can raise another's bytes (a value on the border saved on the other side), so
  the search repeats, raising only the prices of regions over their budget, at most ``MAX_ROUNDS`` times.  Prices
  only go up; with every region at the top price the plan is the fewest-bytes plan, which meets every fractional
  budget by definition, and is the plan returned when the rounds run out.
* the exact MILP with one row per region (``solve_milp``'s ``storage_budgets``), which refines the search's plan on
  graphs small enough, as for one budget, and is the only solver with ``exact_only``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .budget import PRICE_RESOLUTION, Plan, budget_target
from .milp import EXACT_NODE_LIMIT, MILP_NODE_LIMIT, MilpFailed, objective, solve_milp
from .mincut import solve_min_cut
from .parametric import ParametricProblem

log = logging.getLogger(__name__)

# Rounds of the coordinate search.  Each round raises the price of every region over its budget; a region pushed
# over again by a neighbour's raise needs another round.  Two regions of 4 x Linear + ReLU settle in one
# (tests/passes/test_region_budgets.py); past this many, the fewest-bytes plan stands.
MAX_ROUNDS = 8


@dataclass(frozen=True)
class Region:
    storages: tuple[int, ...]  # storage ids of the ParametricProblem
    budget: float | int  # a fraction in [0, 1] (float) or bytes (int)


@dataclass(frozen=True)
class RegionResult:
    plan: Plan
    targets: tuple[int, ...]  # each region's budget in bytes
    saved_bytes: tuple[int, ...]  # what each region keeps in ``plan``
    default_bytes: tuple[int, ...]  # ... in the default plan
    fewest_bytes: tuple[int, ...]  # ... in the fewest-bytes plan
    met: bool  # every region within its target (else: the fewest-bytes plan)
    default_plan: Plan


def region_bytes(problem: ParametricProblem, saved: Sequence[int], region: Region) -> int:
    """The distinct storages of ``region`` that keeping ``saved`` holds alive."""
    kept = {problem.storage[v] for v in saved}
    return sum(problem.storage_bytes[k] for k in region.storages if k in kept)


def _solve(problem: ParametricProblem, regions: Sequence[Region], prices: Sequence[float], default: float) -> Plan:
    """The cut with each region's storages at its price and every other storage at ``default``."""
    per_storage = [default] * len(problem.storage_bytes)
    for region, price in zip(regions, prices):
        for k in region.storages:
            per_storage[k] = price
    cut, _ = problem.at(per_storage)
    solution = solve_min_cut(cut)
    return Plan(
        price=math.nan,
        saved=solution.saved,
        recomputed=solution.recomputed,
        saved_bytes=problem.saved_bytes(solution.saved),
        seconds=problem.seconds(solution.saved, solution.recomputed),
        method="region prices",
        recompute_seconds=problem.recompute_seconds_of(solution.recomputed),
    )


def _fits(problem: ParametricProblem, plan: Plan, regions: Sequence[Region], targets: Sequence[int]) -> list[bool]:
    return [region_bytes(problem, plan.saved, r) <= t for r, t in zip(regions, targets)]


def _coordinate_search(problem, regions, targets, default: float, top: float, fewest: Plan) -> Plan:
    """The cut at the lowest prices found per region (to ``PRICE_RESOLUTION``) where every region fits."""
    prices = [default] * len(regions)
    plan = _solve(problem, regions, prices, default)
    for _ in range(MAX_ROUNDS):
        over = [i for i, ok in enumerate(_fits(problem, plan, regions, targets)) if not ok]
        if not over:
            return plan
        for i in over:
            low, high, best = max(prices[i], top * 1e-12), top, None
            while high / low > PRICE_RESOLUTION:
                mid = math.sqrt(low * high)
                trial = _solve(problem, regions, [*prices[:i], mid, *prices[i + 1 :]], default)
                if region_bytes(problem, trial.saved, regions[i]) <= targets[i]:
                    high, best = mid, trial
                else:
                    low = mid
            prices[i] = high
            plan = best if best is not None else _solve(problem, regions, prices, default)
    return plan if all(_fits(problem, plan, regions, targets)) else fewest


def _exact(problem, regions, targets, default: float, node_limit: int) -> Plan | None:
    rows = [(r.storages, t) for r, t in zip(regions, targets)]
    try:
        plan = solve_milp(problem, default, None, storage_budgets=rows, node_limit=node_limit).plan
    except MilpFailed as error:
        log.debug("per-region MILP failed: %s", error)
        return None
    return plan if all(_fits(problem, plan, regions, targets)) else None


def solve_regions(
    problem: ParametricProblem,
    regions: Sequence[Region],
    default_price: float,
    top_price: float,
    *,
    exact: bool,
    exact_only: bool = False,
) -> RegionResult:
    """The cheapest plan found (time plus ``default_price`` times saved bytes) where every region keeps at most its
    budget.  ``exact``: refine with the MILP (within ``milp.MILP_NODE_LIMIT`` nodes); ``exact_only``: the MILP alone
    (within ``milp.EXACT_NODE_LIMIT``; the search where it fails)."""
    default_plan = _solve(problem, regions, [default_price] * len(regions), default_price)
    fewest = _solve(problem, regions, [top_price] * len(regions), default_price)
    default_bytes = tuple(region_bytes(problem, default_plan.saved, r) for r in regions)
    fewest_bytes = tuple(region_bytes(problem, fewest.saved, r) for r in regions)
    targets = tuple(budget_target(r.budget, d, f) for r, d, f in zip(regions, default_bytes, fewest_bytes))
    met = all(f <= t for f, t in zip(fewest_bytes, targets))
    if all(_fits(problem, default_plan, regions, targets)):
        plan = default_plan
    elif not met:
        plan = fewest
    else:
        plan = _exact(problem, regions, targets, default_price, EXACT_NODE_LIMIT) if exact_only else None
        if plan is None:
            plan = _coordinate_search(problem, regions, targets, default_price, top_price, fewest)
        if exact and not exact_only:
            refined = _exact(problem, regions, targets, default_price, MILP_NODE_LIMIT)
            if refined is not None and objective(problem, refined, default_price) < objective(
                problem, plan, default_price
            ):
                plan = refined
    saved = tuple(region_bytes(problem, plan.saved, r) for r in regions)
    return RegionResult(plan, targets, saved, default_bytes, fewest_bytes, met, default_plan)
