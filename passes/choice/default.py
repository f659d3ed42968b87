"""The choice without a peak-judged budget: the bytes-only choice (``plan.choose_plan``: the default plan, or a
solver's plan within ``memory_budget``), and the default plan that saves a residual stream's block sums where that
costs no memory (``block_sums_plan``), from which every choice starts (the budgets' 1.0 end)."""

from __future__ import annotations

import logging

from ..graph.stored_sums import block_sums, reads_only
from ..solver.budget import Plan, solve_at
from ..solver.mincut import InfeasibleCutError
from ..solver.solvers import SOLVERS
from .judged import graph_estimator
from .plan import choose_plan, priced_by
from .records import Chooser, Choosing, PlanChoice
from .settings import prices

log = logging.getLogger(__name__)


def block_sums_plan(plan: Plan, c: Choosing, problem=None) -> Plan:
    """The default plan, or the one that saves the block sums (``stored_sums.py``) in its place where that saves
    no more bytes and its simulated step peak is no higher: memory first, then the fewer distinct kernels.  The
    simulations run only where the two plans differ.  Every choice starts from it (the budgets' 1.0 end).
    ``problem``: the one ``plan`` was solved on (default: the graph's ``flow.parametric``)."""
    if not SOLVERS[c.settings.solver].peak_judged:
        return plan
    sums = block_sums(c.roles, c.flow.nodes)
    if not sums:
        return plan
    price = prices(c.settings, c.profile)[0]
    try:
        other = solve_at(reads_only(problem or c.flow.parametric, sums, c.profile.mem_bandwidth), price)
    except InfeasibleCutError:
        return plan
    if set(other.saved) == set(plan.saved) or other.saved_bytes > plan.saved_bytes:
        return plan
    estimate = graph_estimator(c)[0]
    if estimate(other).peak_bytes > estimate(plan).peak_bytes:
        return plan
    log.debug("%s: the plan that saves the block sums (%d)", c.request.graph_id, len(sums))
    return priced_by(c.flow.parametric, [other])[0]


def choose_by_bytes(c: Choosing) -> PlanChoice:
    """The bytes-only choice, its default plan maybe saving the block sums.  Without a budget the plan recomputes no
    matmul-class kernel (``flow.default_problem``, docs/DESIGN.md §4.5)."""
    problem, default_problem = c.flow.parametric, c.flow.default_problem
    plan, fields = choose_plan(problem, c.settings, c.profile, c.request.graph_id, default_problem)
    if "budget_bytes" not in fields and not set(plan.recomputed) & set(c.flow.compute_bound):
        problem = default_problem  # the rule held: the block sums' plan keeps it too
    return PlanChoice(block_sums_plan(plan, c, problem), fields)


CHOOSER = Chooser("saved bytes", lambda c: True, choose_by_bytes)
