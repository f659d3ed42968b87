"""``peak_budget``'s choice (docs/DESIGN.md §5.4): the fastest plan whose simulated step peak fits, among the price
search's and checkpointed candidates (``plan.peak_candidates``) ranked by the plan-level estimate into a shortlist
that does not depend on the budget (``shortlists.peak_shortlist``), judged by their simulated step peak
(``judged.JudgedPlans``); the last resort a plan run segment by segment in backward (``_segmented_lowest``)."""

from __future__ import annotations

import warnings

from ..solver.budget import SolveCache, budget_target
from ..solver.shortlists import (
    BUDGET_TIE,
    LOWERED_CANDIDATES,
    STRICT,
    budget_shortlist,
    fastest_first,
    monotone_choice,
    peak_shortlist,
    plan_key,
)
from ..solver.solvers import Budget, cheapest_within
from .contract import CONTRACT_FIELDS, contract_of, contract_plan
from .default import block_sums_plan
from .judged import PEAK_SIMULATED_CANDIDATES, judged_plans, ranked_candidates
from .offload import Offloaded, offloaded_choice
from .plan import choose_plan
from .records import Chooser, Choosing, PlanChoice
from .segmented import Segmentations, built
from .settings import FxrematBudgetWarning, prices


def choose_plan_for_peak(c: Choosing) -> PlanChoice:
    """``peak_budget``'s plan: the fastest shortlisted plan whose simulated step peak (above what the step starts
    with, gradients included: what a user measures) fits it, and whose saved bytes fit ``memory_budget`` when both
    are given.  A float budget is a fraction of the way from the lowest simulated step peak (0.0) to the default
    plan's (1.0).  Under a checkpoint ``contract`` the plan also keeps within the user's plan's saved bytes and
    simulated peak (``_within_contract``)."""
    default_plan, fields, candidates, simulated, peak_cap = _peak_candidates(c)
    candidates = fastest_first([default_plan, *candidates])
    # the shortlist does not depend on the budget: a tighter budget only removes plans, so the peak found is
    # monotone in the budget
    shortlist = peak_shortlist(candidates, simulated.peak, default_plan, PEAK_SIMULATED_CANDIDATES)
    real = {}
    for plan in shortlist:
        simulation = simulated.simulation(plan)
        if simulation is not None:
            real[plan_key(plan)] = simulation.peak_bytes
    shortlist = [p for p in shortlist if plan_key(p) in real]
    lowest = min(shortlist, key=lambda p: (real[plan_key(p)], p.seconds))
    budget = c.settings.peak_budget
    chosen = None if isinstance(budget, float) else next((p for p in shortlist if real[plan_key(p)] <= budget), None)
    # a plan recomputed segment by segment in backward (memory_budget=0.0's plan is the fewest-bytes one) can be lower
    # than every shortlisted plan, but slower than all of them: the last resort, and the bottom of a float budget's
    # scale
    segmented = None
    if chosen is None:
        segmented = _segmented_lowest(c, candidates, shortlist, real, simulated, default_plan)
    floor = real[plan_key(lowest)]
    if segmented is not None and segmented[2].peak_bytes < floor:
        floor = segmented[2].peak_bytes
    else:
        segmented = None
    target = int(min(budget_target(budget, real[plan_key(default_plan)], floor), peak_cap))
    fields.update(
        peak_budget=budget, peak_budget_bytes=target, peak_candidates=len(candidates), peak_simulated=len(shortlist)
    )
    chosen = next((p for p in shortlist if real[plan_key(p)] <= target), None)
    if c.settings.offload:  # a faster plan that fits with offloads (DESIGN §16)
        fastest = chosen.seconds if chosen is not None else float("inf")
        offloaded = offloaded_choice(c, candidates, target, fastest, simulated)
        if offloaded is not None:
            return _offloading(offloaded, fields, simulated, applied=c.settings.offload is True)
    if chosen is None and segmented is not None:  # the segmented plan: it meets the target, or it is the lowest
        segmented_plan, recipe, peak, segment_fields = segmented
        fields.update(segment_fields, peak_budget_met=peak.peak_bytes <= target)
        if peak.peak_bytes <= target:
            return _handed_on(segmented_plan, fields, built(recipe), peak)
    if chosen is None:
        warnings.warn(
            f"fxremat: {c.request.graph_id} cannot keep its simulated step peak within {target} bytes "
            f"(peak_budget={budget!r}); the lowest any candidate plan reaches is {floor} bytes. Using that plan.",
            FxrematBudgetWarning,
            stacklevel=4,
        )
        if segmented is not None:
            return _handed_on(segmented_plan, fields, built(recipe), peak)
    plan = chosen if chosen is not None else lowest
    return _handed_on(plan, dict(fields, peak_budget_met=chosen is not None), *simulated.handed_on(plan))


def _offloading(offloaded: Offloaded, fields: dict, simulated, applied: bool) -> PlanChoice:
    """The choice of a plan with offloads: its split and simulation as without them, the offloads in its fields
    (``applied``: the partition rewrites the split with them, ``offload=True``)."""
    rows = tuple(offloaded.rows())
    if not applied:
        warnings.warn(
            f"fxremat: {len(rows)} saved storages are planned for offload (offload='plan'), but the graphs keep them "
            "on the device; offload=True applies them (docs/DESIGN.md §16)",
            stacklevel=4,
        )
    fields = dict(
        fields,
        peak_budget_met=True,
        offloaded=rows,
        offload_peak_bytes=offloaded.placement.peak_bytes,
        offload_exposed_seconds=offloaded.placement.exposed_seconds,
    )
    return _handed_on(offloaded.plan, fields, *simulated.handed_on(offloaded.plan))


def _handed_on(plan, fields: dict, split, peak) -> PlanChoice:
    """The choice of ``plan``; its report names the method that found it (a checkpointed candidate's, not the
    default plan's that ``choose_plan`` wrote)."""
    return PlanChoice(plan, dict(fields, plan_method=plan.method), split, peak)


def _peak_candidates(c: Choosing):
    """``peak_budget``'s starting point: (the default plan, report fields, candidates within ``memory_budget``'s
    bytes, their ``JudgedPlans``, the peak a checkpoint contract caps, else infinity)."""
    # memory_budget's plan
    default_plan, fields = choose_plan(c.flow.parametric, c.settings, c.profile, c.request.graph_id)
    if "budget_bytes" not in fields:  # the default plan, as every choice starts from it
        default_plan = block_sums_plan(default_plan, c)
    budget_bytes = fields.get("budget_bytes")
    candidates, estimator = ranked_candidates(c, budget_bytes)
    if "budget_bytes" in fields:
        candidates = [p for p in candidates if p.saved_bytes <= fields["budget_bytes"]]
    simulated = judged_plans(c, {plan_key(default_plan)}, estimator)
    peak_cap = float("inf")
    if contract_of(c) is not None:
        default_plan, candidates, peak_cap = _within_contract(c, simulated, default_plan, candidates, fields)
    return default_plan, fields, candidates, simulated, peak_cap


def _within_contract(c: Choosing, simulated, default_plan, candidates, fields):
    """``peak_budget``'s default plan and candidates under a checkpoint contract, and the peak they must keep
    below: (default plan, candidates within the user's plan's saved bytes and ``memory_budget``'s, the user's plan's
    simulated peak).  The default plan is the contract's (``contract_plan``), or with a ``memory_budget`` too the
    price search's plan within both byte bounds."""
    contract = contract_of(c)
    user = contract.user
    honoured, contract_fields = contract_plan(c.flow, c.settings, c.profile, c.request.graph_id, contract, simulated)
    fields.update({name: contract_fields[name] for name in CONTRACT_FIELDS})
    cap = min(fields.get("budget_bytes", user.saved_bytes), user.saved_bytes)
    if "budget_bytes" not in fields:
        default_plan = honoured
    elif default_plan.saved_bytes > cap:
        problem, (price, max_price) = c.flow.parametric, prices(c.settings, c.profile)
        cache = SolveCache(problem)
        budget = Budget(cap, max_price, cache.at(price), cache.at(max_price))
        default_plan = cheapest_within(problem, price, budget, cache)[0]
    simulated.required = {plan_key(user), plan_key(default_plan)}
    candidates = [p for p in [*candidates, honoured, user] if p.saved_bytes <= cap]
    return default_plan, candidates, simulated.peak(user)


def _segmented_lowest(c: Choosing, candidates, shortlist, real, simulated, default_plan):
    """(plan, its lowest-peak segmented recipe, that recipe's simulation, report fields) with the lowest segmented
    peak among the fewest-bytes candidate, the ``LOWERED_CANDIDATES`` lowest-peak shortlisted plans (``real``: plan
    key -> simulated peak) and every plan ``memory_budget``'s walk segments on its way down to the fewest bytes
    (``memory_budget.choose_plan_for_budget``; and the walk without its ``BUDGET_TIE``, which reaches lower
    plans), or None: where ``backward_segments=False``, or no such split can be
    segmented or simulated.  The lowest plan unsegmented often segments lowest too (a plan keeping more bytes
    recomputes less), but not always: a checkpointed plan a little higher unsegmented can segment lower, and a
    ``memory_budget`` that runs it so must not go below ``peak_budget=0.0``."""
    if c.settings.backward_segments is False:
        return None
    segmentations = Segmentations(simulated, c.request, c.profile)
    fewest = min(candidates, key=lambda p: (p.saved_bytes, p.seconds))
    for plan in (fewest, *sorted(shortlist, key=lambda p: (real[plan_key(p)], p.seconds))[:LOWERED_CANDIDATES]):
        segmentations.peak(plan)
    if c.settings.backward_segments is None:  # memory_budget's walk segments as it goes (choose_plan_for_budget)
        walked = budget_shortlist(candidates, simulated.peak, default_plan, fewest)
        for tie in (BUDGET_TIE, STRICT):  # the strict walk passes lower plans (Mixtral)
            monotone_choice(walked, default_plan, fewest.saved_bytes, simulated.peak, segmentations, tie)
    found = [(plan, *segmentation) for plan, segmentation in segmentations.found.values() if segmentation is not None]
    return min(found, key=lambda f: (f[2].peak_bytes, f[0].seconds), default=None)


CHOOSER = Chooser("peak_budget", lambda c: c.settings.peak_budget is not None, choose_plan_for_peak)
