"""choose_plan: from options (price, budget, solver) to one plan over a ParametricProblem, plus report fields.

Budget semantics (docs/DESIGN.md §5.1): ``None`` or ``1.0`` is the default plan (the cut at ``memory_price``); a
float ``f`` in [0, 1) is ``fewest + f * (default - fewest)`` saved bytes, where ``fewest`` is the fewest-bytes plan
(price -> infinity) and ``default`` the default plan's bytes; an int is absolute saved bytes per joint graph.
An unreachable budget: one warning, the fewest-bytes plan, ``budget_met=False``.
"""

from __future__ import annotations

import dataclasses

from ..budget import Plan, SolveCache, budget_target, frontier
from ..checkpoints import checkpoint_grid
from ..costs import DeviceProfile
from ..parametric import ParametricProblem
from ..solvers import SOLVERS, Budget, cheapest_within
from .settings import ChoiceSettings, prices, warn_unreachable


def budget_target_bytes(budget: float | int, default: Plan, fewest: Plan) -> int:
    return budget_target(budget, default.saved_bytes, fewest.saved_bytes)


def plan_key(plan: Plan) -> tuple:
    """What makes two plans the same plan."""
    return plan.saved, plan.recomputed


def fastest_first(plans) -> list[Plan]:
    """Distinct plans, fastest (estimated) first, fewer saved bytes first among equals."""
    distinct = {plan_key(p): p for p in plans}
    return sorted(distinct.values(), key=lambda p: (p.seconds, p.saved_bytes))


def choose_plan(
    problem: ParametricProblem, options: ChoiceSettings, profile: DeviceProfile, graph_id: str
) -> tuple[Plan, dict]:
    price, max_price = prices(options, profile)
    budget = options.memory_budget
    fields: dict = {}
    cache = SolveCache(problem)  # the budget search and the frontier share their max-flows
    solver = SOLVERS[options.solver]
    default = solver.default(problem, price, cache)
    plan = default
    if budget is not None and budget != 1.0:
        fewest = cache.at(max_price)
        target = budget_target_bytes(budget, default, fewest)
        plan, met = solver.within(problem, price, Budget(target, max_price, default, fewest), cache)
        if not met:
            warn_unreachable(graph_id, target, budget, fewest.saved_bytes)
        fields.update(budget_bytes=target, budget_met=met, fewest_saved_bytes=fewest.saved_bytes)
    fields["default_plan_saved_bytes"] = default.saved_bytes
    fields["plan_method"] = plan.method
    if options.compare_default:  # a report-oriented run: also show the frontier
        fields["frontier"] = frontier_field(problem, options, profile, cache)
    return plan, fields


def frontier_field(
    problem: ParametricProblem, options: ChoiceSettings, profile: DeviceProfile, cache: SolveCache
) -> tuple:
    """The report's ``frontier``: (saved bytes, estimated recompute seconds, memory_price) per vertex, the same axes
    as the report's own figures."""
    price, max_price = prices(options, profile)
    points = frontier(problem, price, max_price, cache=cache)
    return tuple((p.saved_bytes, p.recompute_seconds, p.price * profile.mem_bandwidth) for p in points)


# Budgets (fractions of the way from the fewest-bytes plan to the default) whose MILP-refined plans join the
# frontier's vertices as candidates for a peak budget: the vertices alone jump over the middle of the range.
PEAK_CANDIDATE_FRACTIONS = (0.75, 0.5, 0.25, 0.1)


def candidate_plans(
    problem: ParametricProblem, options: ChoiceSettings, profile: DeviceProfile, cache: SolveCache | None = None
) -> list[Plan]:
    """Distinct plans spanning default to fewest bytes, fastest (estimated) first (``cache``: the caller's
    max-flows, shared)."""
    price, max_price = prices(options, profile)
    cache = cache or SolveCache(problem)
    plans = frontier(problem, price, max_price, cache=cache)
    default, fewest = plans[0], plans[-1]
    for fraction in PEAK_CANDIDATE_FRACTIONS:
        target = budget_target_bytes(fraction, default, fewest)
        plans.append(cheapest_within(problem, target, price, max_price, default, fewest, cache)[0])
    return fastest_first(plans)


# Solves per checkpoint set: its plans from the default price to the fewest bytes (within the checkpoint constraint).
CHECKPOINT_FRONTIER_SOLVES = 6


def peak_candidates(
    problem: ParametricProblem,
    forward: list[bool],
    options: ChoiceSettings,
    profile: DeviceProfile,
    budget_bytes: int | None = None,
    cache: SolveCache | None = None,
) -> list[Plan]:
    """Candidates for a peak budget: the price search's plans (``candidate_plans``) and, for a range of checkpoint
    spacings (``checkpoints.py``), the plans that keep those checkpoints and recompute the segments between them
    lazily (the bytes-only frontier has no plan whose recompute is spread over backward).  With a saved-bytes
    budget too, each checkpoint set also gets its cheapest plan within that budget."""
    plans = candidate_plans(problem, options, profile, cache)
    price, max_price = prices(options, profile)
    for constrained in checkpoint_grid(problem, forward):
        cache = SolveCache(constrained)
        found = frontier(constrained, price, max_price, max_solves=CHECKPOINT_FRONTIER_SOLVES, cache=cache)
        if budget_bytes is not None:
            plan, met = cheapest_within(constrained, budget_bytes, price, max_price, found[0], found[-1], cache)
            if met:
                found.append(plan)
        plans.extend(dataclasses.replace(plan, method="checkpoints") for plan in found)
    return fastest_first(plans)


def peak_shortlist(candidates: list[Plan], estimate, default: Plan, most: int) -> list[Plan]:
    """The candidates worth splitting and simulating for a peak budget: the Pareto front of (estimated seconds,
    estimated peak) — each plan whose estimate is lower than every faster plan's — thinned evenly to at most
    ``most`` (keeping the fastest and the lowest), plus the default plan; fastest first."""
    front, best = [], None
    for plan in fastest_first(candidates):
        if best is None or estimate(plan) < best:
            front.append(plan)
            best = estimate(plan)
    if len(front) > most:
        front = [front[round(i * (len(front) - 1) / (most - 1))] for i in range(most)]
    return fastest_first([*front, default])


def budget_shortlist(candidates: list[Plan], estimate, default: Plan, fewest: Plan, most: int) -> list[Plan]:
    """The candidates a ``memory_budget`` chooses among by simulated peak, independent of the budget: those no other
    candidate beats on estimated seconds, saved bytes and estimated peak at once, thinned evenly by saved bytes to at
    most ``most`` (keeping the default and the fewest-bytes plans, so every reachable budget has a plan); fastest
    first.  Independence from the budget is what makes ``monotone_choice`` monotone."""
    plans = fastest_first(candidates)

    def beaten(p: Plan) -> bool:
        return any(
            plan_key(q) != plan_key(p)
            and q.seconds <= p.seconds
            and q.saved_bytes <= p.saved_bytes
            and estimate(q) <= estimate(p)
            for q in plans
        )

    front = sorted((p for p in plans if not beaten(p)), key=lambda p: -p.saved_bytes)
    if len(front) > most - 2:
        front = [front[round(i * (len(front) - 1) / max(1, most - 3))] for i in range(max(1, most - 2))]
    return fastest_first([*front, default, fewest])


@dataclasses.dataclass(frozen=True)
class PeakChoice:
    plan: Plan
    peak: int  # the plan's simulated peak
    lowest_looser_peak: int  # the lowest peak chosen at any looser budget (the default plan's included)
    raised: bool  # the budget itself forced a peak above lowest_looser_peak


# Plans a raised budget choice also judges run another way (``monotone_choice``'s ``lowered``): the lowest by
# their own peak.  Each costs a split and up to ``peak_choice.SEGMENTATIONS_SIMULATED`` simulations.
LOWERED_CANDIDATES = 3


def _lowest(plans: list[Plan], peak_of, lowered) -> tuple[Plan, float]:
    """(the plan of ``plans`` with the lowest peak, that peak), counting ``lowered(plan)`` for the
    ``LOWERED_CANDIDATES`` lowest by their own peak; ties to the faster."""
    ranked = sorted(plans, key=lambda p: (peak_of(p), p.seconds))
    peaks = {plan_key(p): peak_of(p) for p in ranked}
    for p in ranked[:LOWERED_CANDIDATES] if lowered is not None else ():
        peaks[plan_key(p)] = min(peaks[plan_key(p)], lowered(p))
    best = min(ranked, key=lambda p: (peaks[plan_key(p)], p.seconds))
    return best, peaks[plan_key(best)]


def monotone_choice(shortlist: list[Plan], default: Plan, target: int, peak_of, lowered=None) -> PeakChoice:
    """The fastest plan of ``shortlist`` (fastest first) within ``target`` saved bytes whose
    peak (``peak_of(plan)``, simulated on demand) is at most that of the plan chosen at every looser budget,
    the default plan's included; where none is, the lowest-peak plan within ``target`` (``raised``), a plan's peak
    then being ``lowered(plan)`` where that is lower (the plan run another way, e.g. recomputed segment by segment,
    as the budget's choice will run it: ``_lowest``); a tighter budget is held to that peak too.

    Walking the budgets from the loosest down, the chosen plan changes only where a plan stops fitting, so the
    walk visits each distinct saved-bytes level of the shortlist above ``target``, then ``target``.  The shortlist
    does not depend on the budget, so the chosen peak is non-increasing as the budget goes down, except where a
    budget leaves no plan that low (then it is the lowest the budget allows, and ``raised`` says so)."""
    bound = peak_of(default)
    choice = PeakChoice(default, bound, bound, False)
    if target >= default.saved_bytes:
        return choice
    target = max(target, min(p.saved_bytes for p in shortlist))  # an unreachable budget: the fewest bytes
    levels = {p.saved_bytes for p in shortlist if target < p.saved_bytes < default.saved_bytes}
    caps = [*sorted(levels, reverse=True), target]
    for cap in caps:
        fitting = [p for p in shortlist if p.saved_bytes <= cap]
        plan = next((p for p in fitting if peak_of(p) <= bound), None)
        if plan is None:
            plan, peak = _lowest(fitting, peak_of, lowered)
        else:
            peak = peak_of(plan)
        choice = PeakChoice(plan, peak, bound, peak > bound)
        bound = min(bound, choice.peak)
    return choice
