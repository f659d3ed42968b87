"""``memory_budget``'s peak-safe choice (docs/DESIGN.md §5.3): the fastest plan within the saved bytes whose
simulated step peak is no higher than at any looser budget, walking a budget-independent shortlist
(``shortlists.BudgetShortlist``, ``shortlists.monotone_choice``) of the price search's candidates
(``plan.peak_candidates``), judged by their simulated step peak (``judged.JudgedPlans``)."""

from __future__ import annotations

import logging
import warnings

from ..budget import Plan, SolveCache
from ..shortlists import BudgetShortlist, monotone_choice, plan_key
from ..solvers import SOLVERS
from .contract import CONTRACT_FIELDS, contract_plan
from .default import block_sums_plan
from .judged import judged_plans, ranked_candidates
from .plan import budget_target_bytes, choose_plan, frontier_field
from .records import Chooser, Choosing, PlanChoice
from .segmented import Segmentations, built
from .settings import FxrematBudgetWarning, prices, warn_unreachable

log = logging.getLogger(__name__)


def choose_plan_for_budget(c: Choosing) -> PlanChoice:
    """``memory_budget``'s plan, peak-safe: ``monotone_choice`` over the budget-independent shortlist, judged by
    the simulated step peak; under a checkpoint contract its plan is the 1.0 end (``contract.contract_plan``)."""
    settings, request, contract = c.settings, c.request, c.contract
    problem = c.flow.parametric
    price, max_price = prices(settings, c.profile)
    cache = SolveCache(problem)
    default, fewest = block_sums_plan(cache.at(price), c), cache.at(max_price)
    candidates, estimator = ranked_candidates(c, None, cache)
    simulated = judged_plans(c, {plan_key(default)}, estimator)
    contract_fields = {}
    if contract is not None:  # its plan is the default plan: budget 1.0, and the peak every budget stays below
        simulated.required = {plan_key(contract.user)}
        default, contract_fields = contract_plan(c.flow, settings, c.profile, request.graph_id, contract, simulated)
        candidates = [*candidates, contract.user]
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
    try:
        plans = [*candidates, default, fewest]
        shortlist = BudgetShortlist(plans, simulated.peak, default, fewest)  # estimated as the walk needs
        lowered = segmentations.peak if settings.backward_segments is None else None
        choice = monotone_choice(shortlist, default, target, peak_of, lowered)
        if choice.peak == float("inf"):
            raise RuntimeError("no candidate plan within the budget could be simulated")
        fw_bw_recipe, simulation = simulated.handed_on(choice.plan)
    except Exception as error:  # the default plan could not be simulated: the bytes-only choice, said once
        _warn_unsimulated(request.graph_id, settings.memory_budget, error)
        return PlanChoice(*choose_plan(problem, settings, c.profile, request.graph_id))
    fields = _budget_fields(target, met, fewest, default, choice, len(candidates), len(judged), contract_fields)
    if settings.compare_default:  # a report-oriented run: also show the frontier
        fields["frontier"] = frontier_field(problem, settings, c.profile, cache)
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
    """``memory_budget``'s report fields (README's JSON schema)."""
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
