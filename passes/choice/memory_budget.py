"""``memory_budget``'s peak-safe choice (docs/DESIGN.md §5.3): the fastest plan within the saved bytes whose
simulated step peak is no higher than at any looser budget (within ``shortlists.BUDGET_TIE``), walking a
budget-independent shortlist (``shortlists.BudgetShortlist``, ``shortlists.monotone_choice``) of the price search's
candidates (``plan.peak_candidates``), judged by their simulated step peak (``judged.JudgedPlans``); a raised
choice looked at again among the front-loaded plans (``front.front_loaded_choice``)."""

from __future__ import annotations

import logging
import warnings

from ..solver.budget import Plan, SolveCache
from ..solver.shortlists import BUDGET_TIE, BudgetShortlist, monotone_choice, plan_key
from ..solver.solvers import SOLVERS
from .contract import CONTRACT_FIELDS, contract_of, contract_plan
from .default import block_sums_plan
from .front import front_loaded_choice
from .judged import candidate_parts, judged_plans
from .plan import budget_target_bytes, choose_plan, frontier_field
from .records import Chooser, Choosing, PlanChoice
from .segmented import Segmentations, built
from .settings import FxrematBudgetWarning, prices, warn_unreachable

log = logging.getLogger(__name__)


def choose_plan_for_budget(c: Choosing) -> PlanChoice:
    """``memory_budget``'s plan, peak-safe: ``monotone_choice`` over the budget-independent shortlist, judged by
    the simulated step peak; under a checkpoint contract its plan is the 1.0 end (``contract.contract_plan``)."""
    settings, request, contract = c.settings, c.request, contract_of(c)
    problem = c.flow.parametric
    price, max_price = prices(settings, c.profile)
    cache = SolveCache(problem)
    default, fewest = block_sums_plan(cache.at(price), c), cache.at(max_price)
    parts, estimator = candidate_parts(c, None, cache)
    simulated = judged_plans(c, {plan_key(default)}, estimator)
    contract_fields, extra = {}, []
    if contract is not None:  # its plan is the default plan: budget 1.0, and the peak every budget stays below
        simulated.required = {plan_key(contract.user)}
        default, contract_fields = contract_plan(c.flow, settings, c.profile, request.graph_id, contract, simulated)
        extra = [contract.user]
    target = budget_target_bytes(settings.memory_budget, default, fewest)
    met = fewest.saved_bytes <= target
    if not met:
        warn_unreachable(request.graph_id, target, settings.memory_budget, fewest.saved_bytes)
    judged: set = set()  # the plans the walk judged (report: budget_simulated)

    def peak_of(plan: Plan) -> float:
        judged.add(plan_key(plan))
        return simulated.peak(plan)

    # a raised choice runs recomputing the forward segment by segment in backward where that is lower
    segmentations = Segmentations(simulated, request, c.profile)
    lowered = segmentations if settings.backward_segments is None else None

    def walk(refinements: int):
        judged.clear()
        candidates = [*parts.plans(refinements), *extra]
        shortlist = BudgetShortlist([*candidates, default, fewest], simulated.peak, default, fewest)
        return candidates, shortlist, monotone_choice(shortlist, default, target, peak_of, lowered, BUDGET_TIE)

    try:
        candidates, shortlist, choice = walk(_refinements_first(parts, target))
        if not met or shortlist.exhausted or shortlist.reached >= parts.refinements.slower_than():
            candidates, shortlist, choice = walk(len(parts.refinements.targets))  # they may change the choice
        choice = front_loaded_choice(c, choice, default, target, peak_of, lowered, BUDGET_TIE)
        if choice.peak == float("inf"):
            raise RuntimeError("no candidate plan within the budget could be simulated")
        fw_bw_recipe, simulation = simulated.handed_on(choice.plan)
    except Exception as error:  # the default plan could not be simulated: the bytes-only choice, said once
        _warn_unsimulated(request.graph_id, settings.memory_budget, error)
        return PlanChoice(*choose_plan(problem, settings, c.profile, request.graph_id))
    fields = _budget_fields(target, met, fewest, default, choice, len(candidates), len(judged), contract_fields)
    return _finish(c, cache, choice, fields, segmentations, fw_bw_recipe, simulation)


def _refinements_first(parts, target: int) -> int:
    """The MILP refinements made before the walk: those at ``target`` saved bytes or more (at least one).  The walk
    is made again with all of them unless every plan the others can give is slower than any plan it reached
    (``plan.Refinements.slower_than``), it read no step's every plan (``BudgetShortlist.exhausted``: a raised
    budget), and the budget is met (none can lower its fewest bytes): then they cannot change its choice.  At 48
    blocks and memory_budget=0.5 that leaves four of the six HiGHS solves unmade (two of four, ~0.6 CPU s, before 0.35
    and 0.2 joined the grid)."""
    return max(1, sum(t >= target for t in parts.refinements.targets))


def _finish(c: Choosing, cache, choice, fields: dict, segmentations, fw_bw_recipe, simulation) -> PlanChoice:
    """The choice's ``PlanChoice``: the frontier for a report-oriented run, and the plan built segment by segment
    where the walk chose it so."""
    settings, request = c.settings, c.request
    if settings.compare_default:  # a report-oriented run: also show the frontier
        fields["frontier"] = frontier_field(c.flow.parametric, settings, c.profile, cache)
    segmented = segmentations.of(choice.plan)
    if segmented is not None and segmented[1].peak_bytes == choice.peak < simulation.peak_bytes:
        # the walk chose it recomputed segment by segment in backward (``Segmentations.peak``): built so
        fields.update(segmented[2])
        fw_bw_recipe, simulation = built(segmented[0]), segmented[1]
    if fields["peak_raised_by_budget"]:
        message = "%s: memory_budget=%r leaves no plan as low as a looser budget's (%d bytes): %d bytes higher"
        raised = choice.peak - choice.lowest_looser_peak
        log.info(message, request.graph_id, settings.memory_budget, choice.lowest_looser_peak, raised)
    return PlanChoice(choice.plan, fields, fw_bw_recipe, simulation)


def _budget_fields(target, met, fewest, default, choice, candidates: int, judged: int, contract_fields) -> dict:
    """``memory_budget``'s report fields (docs/REPORT.md's JSON schema)."""
    return dict(
        budget_bytes=target,
        budget_met=met,
        fewest_saved_bytes=fewest.saved_bytes,
        default_plan_saved_bytes=default.saved_bytes,
        plan_method=choice.plan.method,
        budget_candidates=candidates,
        budget_simulated=judged,
        peak_raised_by_budget=int(choice.peak - choice.lowest_looser_peak) if choice.raised else 0,
        **{name: contract_fields[name] for name in CONTRACT_FIELDS if name in contract_fields},
    )


def _warn_unsimulated(graph_id: str, budget, error: Exception) -> None:
    warnings.warn(
        f"fxremat: {graph_id}: the step's memory could not be simulated ({type(error).__name__}: {error}); "
        f"memory_budget={budget!r} is met by saved bytes alone, without its peak check. Please report this.",
        FxrematBudgetWarning,
        stacklevel=5,
    )


def _applies(c: Choosing) -> bool:
    return c.settings.memory_budget not in (None, 1.0) and SOLVERS[c.settings.solver].peak_judged


CHOOSER = Chooser("memory_budget, peak-judged", _applies, choose_plan_for_budget)
