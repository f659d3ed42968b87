"""The exact plan under a byte budget, as a mixed-integer program (scipy's ``milp``, HiGHS).  No torch.

Binary ``s_v`` (save v), ``r_v`` (compute v in backward), ``y_k`` (storage k kept alive):

    minimise   sum_v save_seconds(v, price) * s_v  (traffic part)  +  price * sum_k bytes_k * y_k
             + sum_v recompute_seconds(v) * r_v
    subject to s_v + r_v >= 1              for every v backward reads
               s_u + r_u - r_w >= 0        for every input u of w        (a recomputed value needs its inputs)
               y_k - s_v >= 0              for every v stored in k       (saving a view keeps its base)
               sum_k bytes_k * y_k <= B    (optional budget)
               sum_{k in R} bytes_k y_k <= B_R  (optional, one row per region R of storages)
               s_v = 0 where saving is impossible, r_v = 0 where recomputing is

Unlike the cut, bytes are counted once per storage, so the MILP is also the reference the cut is measured against.
Used as ``solver="milp"`` on small graphs, to refine budget plans, and as the test oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .budget import Plan
from .parametric import ParametricProblem

# The solves' limits are counts of HiGHS's branch-and-bound nodes, never seconds: HiGHS is deterministic up to a
# node count, so a graph gets the same plan whatever the machine's load (a wall-clock limit stops wherever the
# load leaves it, with a different incumbent, so a different plan: docs/DESIGN.md §5.1).
# A refinement of the price search's plan (``solvers.py``, ``region_search.py``): its value, docs/DESIGN.md §13.
MILP_NODE_LIMIT = 200
# The exact solver (``solver="milp"``, per-region budgets with it): small graphs; past this many nodes its plan is
# HiGHS's best so far (method "milp (limit)").
EXACT_NODE_LIMIT = 10_000


class MilpFailed(RuntimeError):
    """HiGHS found no feasible plan within its node limit."""


class MilpSolution(NamedTuple):
    plan: Plan
    # HiGHS's dual bound: no plan within the budgets has a lower ``objective``, even where a limit cut the search
    # short; -inf where HiGHS gives none
    dual_bound: float


def solve_milp(
    problem: ParametricProblem,
    price: float,
    budget_bytes: int | None = None,
    time_limit: float | None = None,
    storage_budgets: Sequence[tuple[Sequence[int], int]] = (),
    node_limit: int | None = EXACT_NODE_LIMIT,
) -> MilpSolution:
    """The MILP's plan within ``budget_bytes`` saved bytes (None: no budget), and its dual bound.
    ``storage_budgets``: (storage ids, bytes) pairs, one more row each: the storages of one region keep at most that
    many bytes (per-region budgets, ``region_search.py``).  ``node_limit``: stop after that many branch-and-bound
    nodes (None: none), which gives the same plan whatever the machine's load; ``time_limit`` (seconds, None: none)
    does not, and is for investigations only: plan choice never sets it."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # imported on first use: see mincut.py

    n = problem.num_values
    m = len(problem.storage_bytes)
    cost, upper = _objective_and_bounds(problem, price)
    matrix, lower, upper_rows = _constraints(problem, budget_bytes, storage_budgets)
    result = milp(
        cost,
        constraints=LinearConstraint(matrix, lower, upper_rows),
        integrality=np.ones(2 * n + m),
        bounds=Bounds(np.zeros(2 * n + m), upper),
        options=_limits(time_limit, node_limit),
    )
    if result.x is None:
        raise MilpFailed(f"MILP found no plan ({result.message})")
    x = np.round(result.x).astype(int)
    saved, recomputed = _demanded(problem, {v for v in range(n) if x[v]}, {v for v in range(n) if x[n + v]})
    saved_t, recomputed_t = tuple(sorted(saved)), tuple(sorted(recomputed))
    plan = Plan(
        price=price,
        saved=saved_t,
        recomputed=recomputed_t,
        saved_bytes=problem.saved_bytes(saved_t),
        seconds=problem.seconds(saved_t, recomputed_t),
        method="milp" if result.status == 0 else "milp (limit)",
        recompute_seconds=problem.recompute_seconds_of(recomputed_t),
    )
    dual = getattr(result, "mip_dual_bound", None)
    return MilpSolution(plan, float(dual) if dual is not None and np.isfinite(dual) else float("-inf"))


def _limits(time_limit: float | None, node_limit: int | None) -> dict:
    """scipy ``milp``'s options for these limits (a limit left None is not set)."""
    limits = {"time_limit": time_limit, "node_limit": node_limit}
    return {name: value for name, value in limits.items() if value is not None}


def _objective_and_bounds(problem: ParametricProblem, price: float) -> tuple[np.ndarray, np.ndarray]:
    """The cost vector and the variables' upper bounds; variable layout s_0..s_{n-1}, r_0..r_{n-1}, y_0..y_{m-1}."""
    n = problem.num_values
    m = len(problem.storage_bytes)
    cost = np.zeros(2 * n + m)
    upper = np.ones(2 * n + m)
    for v in range(n):
        traffic = problem.traffic_seconds[v]
        if traffic is None:
            upper[v] = 0
        else:
            cost[v] = traffic * problem.save_scale[v]
            # the memory term of a PREFER_RECOMPUTE value is scaled too: charge the excess on s_v
            cost[v] += price * problem.value_bytes(v) * (problem.save_scale[v] - 1.0)
        recompute = problem.recompute_seconds[v]
        if recompute is None:
            upper[n + v] = 0
        else:
            cost[n + v] = recompute
    for k, nbytes in enumerate(problem.storage_bytes):
        cost[2 * n + k] = price * nbytes
    return cost, upper


def _constraints(problem: ParametricProblem, budget_bytes, storage_budgets):
    """The constraint matrix (CSR) and its row bounds, rows as the module docstring lists them."""
    n = problem.num_values
    m = len(problem.storage_bytes)
    rows, cols, vals, lower, upper_rows = [], [], [], [], []

    def add_row(entries, lo, hi):
        row = len(lower)
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        lower.append(lo)
        upper_rows.append(hi)

    for v in problem.needed:
        add_row([(v, 1.0), (n + v, 1.0)], 1.0, np.inf)
    for u, w in problem.edges:
        add_row([(u, 1.0), (n + u, 1.0), (n + w, -1.0)], 0.0, np.inf)
    for v in range(n):
        add_row([(v, 1.0), (n + v, 1.0)], 0.0, 1.0)
        k = problem.storage[v]
        if k >= 0:
            add_row([(2 * n + k, 1.0), (v, -1.0)], 0.0, np.inf)
    if budget_bytes is not None and m:
        add_row([(2 * n + k, float(b)) for k, b in enumerate(problem.storage_bytes)], -np.inf, float(budget_bytes))
    for storages, nbytes in storage_budgets:
        add_row([(2 * n + k, float(problem.storage_bytes[k])) for k in storages], -np.inf, float(nbytes))
    from scipy.sparse import coo_array  # imported on first use: see mincut.py

    matrix = coo_array((vals, (rows, cols)), shape=(len(lower), 2 * n + m)).tocsr()
    return matrix, np.array(lower), np.array(upper_rows)


def _demanded(problem: ParametricProblem, chosen_save: set[int], chosen_recompute: set[int]) -> tuple[set, set]:
    """Only what backward demands of the MILP's choice (the same walk as the cut's), so plans compare like for
    like: (saved, recomputed)."""
    preds: list[list[int]] = [[] for _ in range(problem.num_values)]
    for u, w in problem.edges:
        preds[w].append(u)
    saved, recomputed, seen = set(), set(), set()
    stack = list(problem.needed)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in chosen_save:
            saved.add(v)
        elif v in chosen_recompute:
            recomputed.add(v)
            stack.extend(preds[v])
        else:
            raise MilpFailed(f"MILP plan leaves needed value {v} unavailable")
    return saved, recomputed


def objective(problem: ParametricProblem, plan: Plan, price: float) -> float:
    """The MILP's objective for any plan: time plus price times distinct saved bytes (``seconds_below``)."""
    extra = sum(price * problem.value_bytes(v) * (problem.save_scale[v] - 1.0) for v in plan.saved)
    traffic = sum((problem.traffic_seconds[v] or 0.0) * problem.save_scale[v] for v in plan.saved)
    recompute = sum(problem.recompute_seconds[v] or 0.0 for v in plan.recomputed)
    return traffic + extra + recompute + price * plan.saved_bytes


def seconds_below(problem: ParametricProblem, price: float, dual_bound: float, saved_bytes: int) -> float:
    """A lower bound on ``plan.seconds`` of any plan saving at most ``saved_bytes`` whose ``objective`` at ``price``
    is at least ``dual_bound`` (a plan within the budget of a MILP with that dual bound): the objective less the
    price of those bytes and the most the save scales can add (``objective``'s extra terms), less a margin: HiGHS
    computes its bound under LP tolerances, so 1e-4 of it (its default relative MIP gap), and rounding."""
    scaled = 0.0
    for v, scale in enumerate(problem.save_scale):
        traffic = problem.traffic_seconds[v]
        if traffic is not None and scale > 1.0:
            scaled += (scale - 1.0) * (traffic + price * problem.value_bytes(v))
    bound = dual_bound - scaled - price * saved_bytes
    return bound - 1e-4 * abs(dual_bound) - 1e-9 * (scaled + price * saved_bytes)
