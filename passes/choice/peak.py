"""Choosing a plan by the simulated peak of its real split: for ``peak_budget`` (the fastest plan whose activation
peak fits) and for ``memory_budget`` (the fastest plan within the saved bytes whose step peak is no higher than at
any looser budget: ``shortlists.monotone_choice``).

Both start from the same candidates (``plan.peak_candidates``: the price search's plans and checkpointed ones),
rank them by the plan-level estimate (``plan_memory.estimate_peak``) into a shortlist that does not depend on the
budget, and judge the shortlisted plans they look at by their simulated step peak (``JudgedPlans``).  That estimate
is ``liveness.simulate_step`` of the plan's split, made without splitting it, so only the chosen plan is split; its
estimate is its report's simulation.  A plan whose estimate fails is split and simulated instead.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _torch_private as tp
from ..budget import Plan, SolveCache, budget_target, solve_at
from ..liveness import PeakEstimate, simulate_step
from ..plan_memory import build_joint_memory, estimate_peak
from ..roles import Role
from ..segments import lowest_peak_segments, segment_recompute_flops
from ..shortlists import (
    LOWERED_CANDIDATES,
    budget_shortlist,
    fastest_first,
    monotone_choice,
    peak_shortlist,
    plan_key,
)
from ..solvers import SOLVERS, cheapest_within
from ..stored_sums import block_sums, reads_only
from .contract import CONTRACT_FIELDS, contract_plan, user_contract
from .plan import budget_target_bytes, choose_plan, frontier_field, peak_candidates
from .regions import choose_plan_for_regions
from .settings import FxrematBudgetWarning, prices, warn_unreachable

log = logging.getLogger(__name__)

# Candidate plans judged by their simulated step peak.
PEAK_SIMULATED_CANDIDATES = 10
# Backward checkpoint sets (passes/segments.py) simulated for a plan that recomputes in segments, lowest estimated
# peak first: each costs a simulation (about 2 s at 48 blocks, docs/DESIGN.md §5.4).
SEGMENTATIONS_SIMULATED = 4


@dataclass
class JudgedPlans:
    """Each plan's simulated step, made on first demand and kept: its estimate (``estimate``, the simulation of its
    split without the split), or where that fails the simulation of its split.  Only a plan handed on is split
    otherwise (the chosen one); ``exact``: False where Inductor's layout decision is taken on the joint graph rather
    than on each forward (``plan_memory.py``), so the chosen plan's split is simulated for its report."""

    split: Callable[[Plan], tuple]
    estimate: Callable[[Plan], PeakEstimate]
    num_fwd_outputs: int
    required: set = field(default_factory=set)  # plan keys whose simulation must not fail (the default plan)
    exact: bool = True
    splits: dict = field(default_factory=dict)
    simulations: dict = field(default_factory=dict)

    def simulation(self, plan: Plan) -> PeakEstimate | None:
        key = plan_key(plan)
        if key not in self.simulations:
            try:
                self.simulations[key] = self.estimate(plan)
            except Exception as error:  # split and simulate it instead
                log.debug("estimate of a candidate plan failed: %s", error, exc_info=True)
                self.simulations[key] = self._simulate_split(plan)
        return self.simulations[key]

    def peak(self, plan: Plan) -> float:
        """The plan's simulated step peak, or infinity where it cannot be simulated."""
        simulation = self.simulation(plan)
        return simulation.peak_bytes if simulation is not None else float("inf")

    def _split(self, plan: Plan) -> tuple:
        key = plan_key(plan)
        if key not in self.splits:
            # lazy modules: a plan's code is generated only once it is called
            with tp.lazy_graph_modules():
                self.splits[key] = self.split(plan)
        return self.splits[key]

    def _simulate_split(self, plan: Plan) -> PeakEstimate | None:
        fw_bw = self._split(plan)[:2]
        if plan_key(plan) in self.required:
            return simulate_step(*fw_bw, self.num_fwd_outputs)
        try:
            return simulate_step(*fw_bw, self.num_fwd_outputs)
        except Exception as error:  # a candidate that cannot be simulated is dropped
            log.debug("simulation of a candidate plan failed: %s", error, exc_info=True)
            return None

    def handed_on(self, plan: Plan) -> tuple[tuple, PeakEstimate]:
        """(the plan's (fw, bw, recipe), its simulation)."""
        key, known = plan_key(plan), plan_key(plan) in self.splits
        split = self._split(plan)
        if not self.exact and not known:
            self.simulations[key] = simulate_step(*split[:2], self.num_fwd_outputs)
        return split, self.simulations[key]


def _plan_estimator(flow, roles, joint, request):
    """(the plan-level estimate of a plan's step (``estimate_peak``), whether that estimate is exactly the
    simulation of the plan's split: ``JudgedPlans.exact``)."""
    memory = build_joint_memory(joint, roles, request.num_fwd_outputs)
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    value_node = [index[n] for n in flow.nodes]
    estimates: dict = {}

    def estimate(plan: Plan):
        key = plan_key(plan)
        if key not in estimates:
            estimates[key] = estimate_peak(memory, {value_node[v] for v in plan.saved})
        return estimates[key]

    return estimate, not memory.channels_last


def _ranked_candidates(flow, roles, joint, options, profile, request, budget_bytes, cache=None):
    """(candidates fastest first, the plan-level estimate of a plan's step, whether that estimate is exact:
    ``_plan_estimator``)."""
    forward = [roles.role[n] is Role.FORWARD for n in flow.nodes]
    candidates = peak_candidates(flow.parametric, forward, options, profile, budget_bytes, cache)
    return candidates, *_plan_estimator(flow, roles, joint, request)


def choose(flow, roles, joint, options, profile, request, split, regions=None):
    """The plan for these options: (plan, report fields, (fw, bw, recipe) where choosing split it, or None, its
    simulation or None).  ``split(plan)`` makes a plan's split; ``regions``: per-region budgets (``region_plan``,
    chosen by saved bytes alone).  Otherwise, with checkpoint tags in the graph (and ``checkpoints="honour"``), every
    choice also keeps within the user's plan (``contract.py``)."""
    if regions is not None:
        return choose_plan_for_regions(flow, options, profile, request, regions)
    contract = user_contract(flow, roles, options, profile)
    if options.peak_budget is not None:
        return choose_plan_for_peak(flow, roles, joint, options, profile, request, split, contract)
    if options.memory_budget not in (None, 1.0) and SOLVERS[options.solver].peak_judged:
        return choose_plan_for_budget(flow, roles, joint, options, profile, request, split, contract)
    if contract is not None:
        estimate, exact = _plan_estimator(flow, roles, joint, request)
        required = {plan_key(contract.user)}
        judged = JudgedPlans(split, estimate, request.num_fwd_outputs, required=required, exact=exact)
        plan, fields = contract_plan(flow, options, profile, request.graph_id, contract, judged)
        return plan, fields, *judged.handed_on(plan)
    plan, fields = choose_plan(flow.parametric, options, profile, request.graph_id)
    return block_sums_plan(plan, flow, roles, joint, options, profile, request), fields, None, None


def block_sums_plan(plan: Plan, flow, roles, joint, options, profile, request) -> Plan:
    """The default plan, or the one that saves the block sums (``stored_sums.py``) in its place where that saves
    no more bytes and its simulated step peak is no higher: memory first, then the fewer distinct kernels.  The
    simulations run only where the two plans differ.  Every choice starts from it (the budgets' 1.0 end)."""
    if not SOLVERS[options.solver].peak_judged:
        return plan
    sums = block_sums(roles, flow.nodes)
    if not sums:
        return plan
    price = prices(options, profile)[0]
    other = solve_at(reads_only(flow.parametric, sums, profile.mem_bandwidth), price)
    if set(other.saved) == set(plan.saved) or other.saved_bytes > plan.saved_bytes:
        return plan
    estimate, _ = _plan_estimator(flow, roles, joint, request)
    if estimate(other).peak_bytes > estimate(plan).peak_bytes:
        return plan
    log.debug("%s: the plan that saves the block sums (%d)", request.graph_id, len(sums))
    # its seconds by the problem's own prices, as every other plan's
    problem = flow.parametric
    return dataclasses.replace(other, seconds=problem.seconds(other.saved, other.recomputed))


def choose_plan_for_budget(flow, roles, joint, options, profile, request, split, contract=None):
    """``memory_budget``'s plan, peak-safe: ``monotone_choice`` over the budget-independent shortlist, judged by
    the simulated step peak.  (plan, report fields, (fw, bw, recipe) or None, its simulation or None)."""
    problem = flow.parametric
    price, max_price = prices(options, profile)
    cache = SolveCache(problem)
    default, fewest = (
        block_sums_plan(cache.at(price), flow, roles, joint, options, profile, request),
        cache.at(max_price),
    )
    candidates, estimate, exact = _ranked_candidates(flow, roles, joint, options, profile, request, None, cache)
    simulated = JudgedPlans(split, estimate, request.num_fwd_outputs, required={plan_key(default)}, exact=exact)
    contract_fields = {}
    if contract is not None:  # its plan is the default plan: budget 1.0, and the peak every budget stays below
        simulated.required = {plan_key(contract.user)}
        default, contract_fields = contract_plan(flow, options, profile, request.graph_id, contract, simulated)
        candidates = [*candidates, contract.user]
    target = budget_target_bytes(options.memory_budget, default, fewest)
    met = fewest.saved_bytes <= target
    if not met:
        warn_unreachable(request.graph_id, target, options.memory_budget, fewest.saved_bytes)
    judged: set = set()  # the plans the walk judged (report: budget_simulated)

    def peak_of(plan: Plan) -> float:
        judged.add(plan_key(plan))
        return simulated.peak(plan)

    # a raised choice runs recomputing the forward segment by segment in backward where that is lower
    segmentations = _Segmentations(simulated, request, profile)
    try:
        plans = [*candidates, default, fewest]
        shortlist = budget_shortlist(plans, simulated.peak, default, fewest, PEAK_SIMULATED_CANDIDATES)
        lowered = segmentations.peak if options.backward_segments is None else None
        choice = monotone_choice(shortlist, default, target, peak_of, lowered)
        if choice.peak == float("inf"):
            raise RuntimeError("no candidate plan within the budget could be simulated")
        fw_bw_recipe, simulation = simulated.handed_on(choice.plan)
    except Exception as error:  # the default plan could not be simulated: the bytes-only choice, said once
        _warn_unsimulated(request.graph_id, options.memory_budget, error)
        plan, fields = choose_plan(problem, options, profile, request.graph_id)
        return plan, fields, None, None
    fields = _budget_fields(target, met, fewest, default, choice, len(candidates), len(judged), contract_fields)
    if options.compare_default:  # a report-oriented run: also show the frontier
        fields["frontier"] = frontier_field(problem, options, profile, cache)
    segmented = segmentations.of(choice.plan)
    if segmented is not None and segmented[1].peak_bytes == choice.peak < simulation.peak_bytes:
        # the walk chose it recomputed segment by segment in backward (``_Segmentations.peak``): built so
        fields.update(segmented[2])
        fw_bw_recipe, simulation = _built(segmented[0]), segmented[1]
    if fields["peak_raised_by_budget"]:
        message = "%s: memory_budget=%r leaves no plan as low as a looser budget's (%d bytes): %d bytes higher"
        log.info(
            message,
            request.graph_id,
            options.memory_budget,
            choice.lowest_looser_peak,
            choice.peak - choice.lowest_looser_peak,
        )
    return choice.plan, fields, fw_bw_recipe, simulation


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


@dataclass
class _Segmentations:
    """Each plan's lowest-peak segmentation (``_segmentation``: recipe, simulation, report fields, or None where it
    has none), made on first demand and kept."""

    simulated: JudgedPlans
    request: object
    profile: object
    found: dict = field(default_factory=dict)  # plan key -> (plan, its segmentation or None)

    def peak(self, plan: Plan) -> float:
        """The plan's peak run segment by segment in backward, or infinity where it cannot be."""
        key = plan_key(plan)
        if key not in self.found:
            self.found[key] = (plan, _segmentation(self.simulated, plan, self.request, self.profile))
        segmentation = self.found[key][1]
        return segmentation[1].peak_bytes if segmentation is not None else float("inf")

    def of(self, plan: Plan):
        return self.found.get(plan_key(plan), (plan, None))[1]


def _segmentation(simulated: JudgedPlans, plan: Plan, request, profile):
    """The plan's lowest-peak segmentation (``lowest_segmentation``: recipe, simulation, report fields), or None
    where its split cannot be segmented or simulated (then it is not a way to run the plan)."""
    try:
        (_, _, recipe), simulation = simulated.handed_on(plan)
        if recipe is None or simulation is None:  # a plan that cannot be simulated is not judged
            return None
        return lowest_segmentation(recipe, request.num_fwd_outputs, profile, simulation)
    except Exception as error:
        log.debug("segmenting a raised budget choice failed: %s", error, exc_info=True)
        return None


def _warn_unsimulated(graph_id: str, budget, error: Exception) -> None:
    warnings.warn(
        f"fxremat: {graph_id}: the step's memory could not be simulated ({type(error).__name__}: {error}); "
        f"memory_budget={budget!r} is met by saved bytes alone, without its peak check. Please report this.",
        FxrematBudgetWarning,
        stacklevel=5,
    )


def segmented_split(recipe, num_fwd_outputs: int, profile):
    """The lowest-peak segmentation of a split's backward, built: ((fw, bw, recipe), its simulation, report fields)."""
    segmented, peak, fields = lowest_segmentation(recipe, num_fwd_outputs, profile)
    return _built(segmented), peak, fields


def lowest_segmentation(recipe, num_fwd_outputs: int, profile, simulation=None):
    """The recipe or its lowest-peak segmentation (``segments.lowest_peak_segments``, at most
    ``SEGMENTATIONS_SIMULATED`` tried; ``simulation``: the recipe's own, where known), its simulation and its
    report fields: (recipe, simulation, fields)."""
    segmented, peak = lowest_peak_segments(
        recipe, num_fwd_outputs, profile, limit=SEGMENTATIONS_SIMULATED, simulation=simulation
    )
    fields = dict(
        segment_recompute_flops=segment_recompute_flops(recipe, segmented, profile),
        backward_checkpoints=tuple(sorted(n.name for n in segmented.bw_checkpoints)),
    )
    return segmented, peak, fields


def _built(recipe) -> tuple:
    with tp.lazy_graph_modules():
        return (*recipe.build(), recipe)


def choose_plan_for_peak(flow, roles, joint, options, profile, request, split, contract=None):
    """``peak_budget``'s plan: the fastest shortlisted plan whose simulated step peak (above what the step starts
    with, gradients included: what a user measures) fits it, and whose saved bytes fit ``memory_budget`` when both
    are given.  A float budget is a fraction of the way from the lowest simulated step peak (0.0) to the default
    plan's (1.0).  Under a checkpoint ``contract`` the plan also keeps within the user's plan's saved bytes and
    simulated peak (``_within_contract``).  Returns as ``choose_plan_for_budget``."""
    default_plan, fields, candidates, simulated, peak_cap = _peak_candidates(
        flow, roles, joint, options, profile, request, split, contract
    )
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
    budget = options.peak_budget
    chosen = None if isinstance(budget, float) else next((p for p in shortlist if real[plan_key(p)] <= budget), None)
    # a plan recomputed segment by segment in backward (memory_budget=0.0's plan is the fewest-bytes one) can be lower
    # than every shortlisted plan, but slower than all of them: the last resort, and the bottom of a float budget's
    # scale
    segmented = None
    if chosen is None:
        segmented = _segmented_lowest(candidates, shortlist, real, simulated, options, request, profile, default_plan)
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
    if chosen is None and segmented is not None:  # the segmented plan: it meets the target, or it is the lowest
        segmented_plan, recipe, peak, segment_fields = segmented
        fields.update(segment_fields, peak_budget_met=peak.peak_bytes <= target)
        if peak.peak_bytes <= target:
            return segmented_plan, fields, _built(recipe), peak
    if chosen is None:
        warnings.warn(
            f"fxremat: {request.graph_id} cannot keep its simulated step peak within {target} bytes "
            f"(peak_budget={budget!r}); the lowest any candidate plan reaches is {floor} bytes. Using that plan.",
            FxrematBudgetWarning,
            stacklevel=4,
        )
        if segmented is not None:
            return segmented_plan, fields, _built(recipe), peak
    plan = chosen if chosen is not None else lowest
    return plan, dict(fields, peak_budget_met=chosen is not None), *simulated.handed_on(plan)


def _peak_candidates(flow, roles, joint, options, profile, request, split, contract):
    """``peak_budget``'s starting point: (the default plan, report fields, candidates within ``memory_budget``'s
    bytes, their ``JudgedPlans``, the peak a checkpoint contract caps, else infinity)."""
    default_plan, fields = choose_plan(flow.parametric, options, profile, request.graph_id)  # memory_budget's plan
    if "budget_bytes" not in fields:  # the default plan, as every choice starts from it
        default_plan = block_sums_plan(default_plan, flow, roles, joint, options, profile, request)
    budget_bytes = fields.get("budget_bytes")
    candidates, estimate, exact = _ranked_candidates(flow, roles, joint, options, profile, request, budget_bytes)
    if "budget_bytes" in fields:
        candidates = [p for p in candidates if p.saved_bytes <= fields["budget_bytes"]]
    simulated = JudgedPlans(split, estimate, request.num_fwd_outputs, required={plan_key(default_plan)}, exact=exact)
    peak_cap = float("inf")
    if contract is not None:
        default_plan, candidates, peak_cap = _within_contract(
            flow, options, profile, request, contract, simulated, default_plan, candidates, fields
        )
    return default_plan, fields, candidates, simulated, peak_cap


def _within_contract(flow, options, profile, request, contract, simulated, default_plan, candidates, fields):
    """``peak_budget``'s default plan and candidates under a checkpoint contract, and the peak they must keep
    below: (default plan, candidates within the user's plan's saved bytes and ``memory_budget``'s, the user's plan's
    simulated peak).  The default plan is the contract's (``contract_plan``), or with a ``memory_budget`` too the
    price search's plan within both byte bounds."""
    user = contract.user
    honoured, contract_fields = contract_plan(flow, options, profile, request.graph_id, contract, simulated)
    fields.update({name: contract_fields[name] for name in CONTRACT_FIELDS})
    cap = min(fields.get("budget_bytes", user.saved_bytes), user.saved_bytes)
    if "budget_bytes" not in fields:
        default_plan = honoured
    elif default_plan.saved_bytes > cap:
        problem, (price, max_price) = flow.parametric, prices(options, profile)
        cache = SolveCache(problem)
        default_plan = cheapest_within(problem, cap, price, max_price, cache.at(price), cache.at(max_price), cache)[0]
    simulated.required = {plan_key(user), plan_key(default_plan)}
    candidates = [p for p in [*candidates, honoured, user] if p.saved_bytes <= cap]
    return default_plan, candidates, simulated.peak(user)


def _segmented_lowest(candidates, shortlist, real, simulated, options, request, profile, default_plan):
    """(plan, its lowest-peak segmented recipe, that recipe's simulation, report fields) with the lowest segmented
    peak among the fewest-bytes candidate, the ``LOWERED_CANDIDATES`` lowest-peak shortlisted plans (``real``: plan
    key -> simulated peak) and every plan ``memory_budget``'s walk segments on its way down to the fewest bytes
    (``_segmented_by_budget_walk``), or None: where ``backward_segments=False``, or no such split can be segmented or
    simulated.  The lowest plan unsegmented often segments lowest too (a plan keeping more bytes recomputes less),
    but not always: a checkpointed plan a little higher unsegmented can segment lower, and a ``memory_budget`` that
    runs it so must not go below ``peak_budget=0.0``."""
    if options.backward_segments is False:
        return None
    segmentations = _Segmentations(simulated, request, profile)
    fewest = min(candidates, key=lambda p: (p.saved_bytes, p.seconds))
    for plan in (fewest, *sorted(shortlist, key=lambda p: (real[plan_key(p)], p.seconds))[:LOWERED_CANDIDATES]):
        segmentations.peak(plan)
    if options.backward_segments is None:  # memory_budget's walk segments as it goes (choose_plan_for_budget)
        walked = budget_shortlist(candidates, simulated.peak, default_plan, fewest, PEAK_SIMULATED_CANDIDATES)
        monotone_choice(walked, default_plan, fewest.saved_bytes, simulated.peak, segmentations.peak)
    found = [(plan, *segmentation) for plan, segmentation in segmentations.found.values() if segmentation is not None]
    return min(found, key=lambda f: (f[2].peak_bytes, f[0].seconds), default=None)
