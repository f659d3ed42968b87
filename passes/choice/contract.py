"""User checkpoints as a memory contract (issue #22, docs/DESIGN.md §5.6).

A user who wrapped blocks in ``torch.utils.checkpoint`` asked for checkpoint's memory.  The *user's plan* is
fxremat's own cut with every value still tagged ``PREFER_RECOMPUTE``/``MUST_RECOMPUTE`` after the boundary clean-up
forced to be recomputed (``passes/solver/user_plan.py``), untagged values priced as usual.  With
``checkpoints="honour"`` (the default) a graph with such tags gets the fastest candidate plan whose saved bytes and
simulated step peak are both no higher than the user's plan's: fxremat may save less, or re-plan inside a region where
that raises neither. The user's plan is itself a candidate, so one always fits.  ``memory_budget`` and ``peak_budget``
apply on top (``memory_budget.py``, ``peak.py``).  ``checkpoints="replan"`` hands the regions to fxremat's costs (a tag
is a bias then, ``flow_problem.PREFER_FACTOR``).
"""

from __future__ import annotations

import dataclasses
import logging

from ..graph.flow_problem import RECOMPUTE_TAGS
from ..graph.roles import Role, recompute_tag
from ..solver.budget import Plan, SolveCache, solve_at
from ..solver.shortlists import fastest_first, plan_key
from ..solver.solvers import Budget, cheapest_within
from ..solver.user_plan import ForcedProblem, force_recompute
from .judged import judged_plans
from .plan import choose_plan, refinements_of
from .records import Chooser, Choosing, PlanChoice
from .settings import ChoiceSettings, prices

log = logging.getLogger(__name__)

# The report fields a contract adds (the user's plan's figures).
CONTRACT_FIELDS = ("user_plan_saved_bytes", "user_plan_simulated_peak_bytes")
# Candidates of the price search judged by simulated peak before the user's plan itself is taken (each judgement is
# one simulation of the step; the cheapest plan within the user's bytes is judged first and usually fits).
CONTRACT_JUDGED = 6


@dataclasses.dataclass(frozen=True)
class Contract:
    user: Plan  # the user's plan
    forced: ForcedProblem  # the cut problem with the tagged values forced to recompute
    tagged: frozenset[int]  # value indices still tagged for recompute after the boundary clean-up


def tagged_values(flow, roles) -> frozenset[int]:
    """The forward values (flow indices) still tagged for recompute after the boundary clean-up.  Backward-only
    values are left out: they run once either way (traced through eager checkpointing, backward's own ops carry
    the region's tag too), and the user's saved bytes bound them anyway."""
    return frozenset(
        i
        for i, node in enumerate(flow.nodes)
        if roles.role[node] is Role.FORWARD and recompute_tag(node) in RECOMPUTE_TAGS
    )


def contract_of(c: Choosing) -> Contract | None:
    """The user's checkpoints as this graph's contract (``user_contract``), made on first demand, once per graph."""
    if "contract" not in c.made:
        c.made["contract"] = user_contract(c.flow, c.roles, c.settings, c.profile)
    return c.made["contract"]


def user_contract(flow, roles, settings: ChoiceSettings, profile) -> Contract | None:
    """The contract for this graph, or None: with ``checkpoints="replan"``, or where no tag forces anything."""
    if settings.checkpoints != "honour":
        return None
    tagged = tagged_values(flow, roles)
    forced = force_recompute(flow.parametric, tagged)
    if not forced.forced:
        return None
    price, _ = prices(settings, profile)
    user = dataclasses.replace(solve_at(forced.problem, price), method="user checkpoints")
    return Contract(user, forced, tagged)


def fits(plan: Plan, bytes_cap: float, peak_cap: float, peak_of) -> bool:
    return plan.saved_bytes <= bytes_cap and peak_of(plan) <= peak_cap


def contract_plan(
    flow, settings: ChoiceSettings, profile, graph_id: str, contract: Contract, judged
) -> tuple[Plan, dict]:
    """The default plan under the contract: the fastest candidate within the user's plan's saved bytes whose
    simulated step peak (``judged.peak``) is no higher than the user's plan's; (plan, report fields)."""
    problem = flow.parametric
    price, max_price = prices(settings, profile)
    cache = SolveCache(problem)
    # the default cut without budgets (they apply on top of the contract: memory_budget.py, peak.py)
    plain = dataclasses.replace(settings, memory_budget=None, peak_budget=None)
    default, fields = choose_plan(problem, plain, profile, graph_id)
    user = contract.user
    bytes_cap, peak_cap = user.saved_bytes, judged.peak(user)
    fewest = cache.at(max_price)
    within, _ = cheapest_within(problem, price, Budget(bytes_cap, max_price, cache.at(price), fewest), cache)
    chosen = next(p for p in fastest_first([default, within, user]) if fits(p, bytes_cap, peak_cap, judged.peak))
    if plan_key(chosen) == plan_key(user):
        # the price search's other plans within the user's bytes and faster than it, fastest first
        more = [
            p
            for p in refinements_of(problem, (price, max_price), cache).every()
            if p.saved_bytes <= bytes_cap and p.seconds < user.seconds
        ]
        fitting = (p for p in fastest_first(more)[:CONTRACT_JUDGED] if fits(p, bytes_cap, peak_cap, judged.peak))
        chosen = next(fitting, user)
    fields.update(
        plan_method=chosen.method,
        user_plan_saved_bytes=user.saved_bytes,
        user_plan_simulated_peak_bytes=int(peak_cap),
    )
    log.debug(
        "%s: user's plan %d bytes, peak %d; chosen %s (%d bytes)",
        graph_id,
        user.saved_bytes,
        peak_cap,
        chosen.method,
        chosen.saved_bytes,
    )
    return chosen, fields


def choose_within_contract(c: Choosing) -> PlanChoice:
    """Without a budget, under the user's checkpoints: the contract's plan (``contract_plan``)."""
    contract = contract_of(c)
    judged = judged_plans(c, {plan_key(contract.user)})
    plan, fields = contract_plan(c.flow, c.settings, c.profile, c.request.graph_id, contract, judged)
    return PlanChoice(plan, fields, *judged.handed_on(plan))


CHOOSER = Chooser("the user's checkpoints", lambda c: contract_of(c) is not None, choose_within_contract)


def kept_tagged(plan: Plan, flow, roles, checkpoints: str) -> tuple[tuple[str, str], ...]:
    """The report's ``checkpoint_kept``: (name, why) for every value still tagged for recompute that ``plan`` keeps
    for backward (``checkpoints``: the user's setting, ``ChoiceSettings.checkpoints``)."""
    tagged = tagged_values(flow, roles)
    unforced = force_recompute(flow.parametric, tagged).unforced
    rows = []
    for v in sorted(set(plan.saved) & tagged):
        node = flow.nodes[v]
        if node in roles.no_recompute:
            why = f"never recomputed: {roles.no_recompute[node]}"
        elif v in unforced:
            why = "cannot be recomputed: it reads a value that is neither saved nor recomputed"
        elif checkpoints == "replan":
            why = "checkpoints='replan': cheaper to keep at fxremat's costs"
        else:
            why = "re-planned inside the region: no more saved bytes and no higher simulated peak than the user's plan"
        rows.append((node.name, why))
    return tuple(rows)
