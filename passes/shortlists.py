"""Choosing among plans on plain numbers (no torch): what makes two plans the same, fastest first, the shortlists a
peak-judged choice simulates (``passes/choice/peak.py``), and ``memory_budget``'s monotone walk over one.

A plan's peak is a function the caller hands in (``peak_of``: in ``passes/choice/`` the simulated step peak), so this
tier never simulates anything itself.
"""

from __future__ import annotations

import dataclasses

from .budget import Plan


def plan_key(plan: Plan) -> tuple:
    """What makes two plans the same plan."""
    return plan.saved, plan.recomputed


def fastest_first(plans) -> list[Plan]:
    """Distinct plans, fastest (estimated) first, fewer saved bytes first among equals."""
    distinct = {plan_key(p): p for p in plans}
    return sorted(distinct.values(), key=lambda p: (p.seconds, p.saved_bytes))


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


def budget_shortlist(candidates: list[Plan], estimate, default: Plan, fewest: Plan) -> list[Plan]:
    """The candidates a ``memory_budget`` chooses among by simulated peak, independent of the budget: those no other
    candidate beats on estimated seconds, saved bytes and estimated peak at once, with the default and the
    fewest-bytes plans (so every reachable budget has a plan); fastest first.  Independence from the budget is what
    makes ``monotone_choice`` monotone.  Not thinned: finding the beaten plans estimates most candidates anyway
    (benchmarks/RESULTS.md, session 19: 25 of 39), and a thinned front dropped the plans between the frontier's
    vertices that a budget needs (stack at 0.5: the 2.4 MB plan at 7.3 ms, leaving a 12.4 ms one; "Session 21")."""
    plans = fastest_first(candidates)

    def beaten(p: Plan) -> bool:
        return any(
            plan_key(q) != plan_key(p)
            and q.seconds <= p.seconds
            and q.saved_bytes <= p.saved_bytes
            and estimate(q) <= estimate(p)
            for q in plans
        )

    return fastest_first([*(p for p in plans if not beaten(p)), default, fewest])


@dataclasses.dataclass(frozen=True)
class PeakChoice:
    plan: Plan
    peak: int  # the plan's simulated peak
    lowest_looser_peak: int  # the lowest peak chosen at any looser budget (the default plan's included)
    raised: bool  # the budget itself forced a peak above lowest_looser_peak


# Plans a raised budget choice also judges run another way (``monotone_choice``'s ``lowered``): the lowest by
# their own peak.  Each costs a split and up to ``passes/choice/peak.py``'s ``SEGMENTATIONS_SIMULATED`` simulations.
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
