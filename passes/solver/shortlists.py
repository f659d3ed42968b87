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


def _dominates(q: Plan, p: Plan, estimate) -> bool:
    """``q`` beats ``p`` on estimated seconds, saved bytes and estimated peak at once (``p``'s peak is estimated only
    where ``q`` is no slower and no larger)."""
    return (
        plan_key(q) != plan_key(p)
        and q.seconds <= p.seconds
        and q.saved_bytes <= p.saved_bytes
        and estimate(q) <= estimate(p)
    )


def budget_shortlist(candidates: list[Plan], estimate, default: Plan, fewest: Plan) -> list[Plan]:
    """The candidates a ``memory_budget`` chooses among by simulated peak, independent of the budget: those no other
    candidate beats on estimated seconds, saved bytes and estimated peak at once, with the default and the fewest-bytes
    plans (so every reachable budget has a plan); fastest first.  Independence from the budget is what makes
    ``monotone_choice`` monotone.  Not thinned: finding the beaten plans estimates most candidates anyway, and a thinned
    front drops the plans between the frontier's vertices that a budget needs (docs/DESIGN.md §5.3). ``BudgetShortlist``
    is the same list with each plan's place in it decided on demand."""
    plans = fastest_first(candidates)

    def beaten(p: Plan) -> bool:
        return any(_dominates(q, p, estimate) for q in plans)

    return fastest_first([*(p for p in plans if not beaten(p)), default, fewest])


class BudgetShortlist:
    """``budget_shortlist(candidates, estimate, default, fewest)`` for ``monotone_choice``, each plan's membership
    decided when the walk reaches it, so only the plans the walk passes are estimated (a plan's beaters are no
    slower and no larger, so they fit wherever it fits and come before it: the walk has estimated them already).
    At 48 blocks and memory_budget=0.5 the eager shortlist estimated 27 plans, most of them never walked past."""

    def __init__(self, candidates: list[Plan], estimate, default: Plan, fewest: Plan):
        self.plans, self.estimate = fastest_first(candidates), estimate
        self.ends = {plan_key(fewest): 2, plan_key(default): 1}  # one plan both ends is placed as the default
        self.member: dict = {}
        # What a walk over it read: the slowest plan it reached, and whether a step read every plan within its cap
        # (a raised one). A walk that read no plan as slow as s, and none all, chooses the same among these
        # candidates and any more that are all slower than s (``memory_budget.choose_plan_for_budget``).
        self.reached, self.exhausted = float("-inf"), False
        self.plans = sorted(self.plans, key=lambda p: (p.seconds, p.saved_bytes, self._late(p)))

    def _beaten(self, p: Plan) -> bool:
        key = plan_key(p)
        if key not in self.member:
            self.member[key] = not any(_dominates(q, p, self.estimate) for q in self.plans)
        return not self.member[key]

    def _late(self, p: Plan) -> int:
        """``budget_shortlist`` appends a beaten default (1), then a beaten fewest-bytes plan (2), after the plans
        tied with it on seconds and bytes; only a tie makes the place depend on it, so only then is it estimated."""
        end = self.ends.get(plan_key(p), 0)
        tied = any(q.seconds == p.seconds and q.saved_bytes == p.saved_bytes and q is not p for q in self.plans)
        return end if end and tied and self._beaten(p) else 0

    def kept(self, p: Plan) -> bool:
        return plan_key(p) in self.ends or not self._beaten(p)

    def fitting(self, cap: int):
        """The shortlist's plans within ``cap`` saved bytes, fastest first, decided as they are reached."""
        for p in self.plans:
            if p.saved_bytes <= cap:
                self.reached = max(self.reached, p.seconds)
                if self.kept(p):
                    yield p
        self.exhausted = True  # only a raised step (``_lowest``) reads every plan within a cap

    def fewest_bytes(self) -> int:
        return next(p.saved_bytes for p in sorted(self.plans, key=lambda p: p.saved_bytes) if self.kept(p))

    def levels(self) -> set:
        """Every candidate's saved bytes: the shortlist's and more.  A level no shortlisted plan has leaves the
        walk's plans within it those of the next level down, so walking it first repeats that step: the same
        plan and peak, and the bound it leaves is the one that step leaves (``monotone_choice`` reads the bound
        before the target's step past such levels: ``is_level``)."""
        return {p.saved_bytes for p in self.plans}

    def is_level(self, saved_bytes: int) -> bool:
        """Whether a shortlisted plan saves exactly this many bytes."""
        return any(self.kept(p) for p in self.plans if p.saved_bytes == saved_bytes)


class _Listed:
    """A shortlist already made (a list, fastest first), as ``monotone_choice`` reads one."""

    def __init__(self, plans: list[Plan]):
        self.plans = plans

    def fitting(self, cap: int):
        return (p for p in self.plans if p.saved_bytes <= cap)

    def fewest_bytes(self) -> int:
        return min(p.saved_bytes for p in self.plans)

    def levels(self) -> set:
        return {p.saved_bytes for p in self.plans}

    def is_level(self, saved_bytes: int) -> bool:
        return True  # ``levels`` are the list's own


@dataclasses.dataclass(frozen=True)
class PeakChoice:
    plan: Plan
    peak: int  # the plan's simulated peak
    lowest_looser_peak: int  # the lowest peak chosen at any looser budget (the default plan's included)
    raised: bool  # the budget itself forced a peak above lowest_looser_peak (beyond the walk's ``PeakTie``)


@dataclasses.dataclass(frozen=True)
class PeakTie:
    """When ``monotone_choice`` counts a plan a little above the lowest looser peak as no higher: within
    ``tolerance`` of it, and only where it cuts the seconds of the plan it would otherwise take by at least
    ``exchange`` times its relative rise in peak (memory first: a tie must buy much more time than it costs peak)."""

    tolerance: float
    exchange: float

    def within(self, peak: float, bound: float) -> bool:
        return peak <= bound * (1.0 + self.tolerance)

    def worth(self, tied: Plan, tied_peak: float, other: Plan, other_peak: float) -> bool:
        gain = 1.0 - tied.seconds / other.seconds if other.seconds > 0 else 0.0
        return gain >= self.exchange * (tied_peak / other_peak - 1.0)


STRICT = PeakTie(0.0, 0.0)

# ``memory_budget``'s ties.  Plans of one step differ by less than the simulator's precision, and a strict bound
# lets such a tie decide: the looser budget's lower plan holds every tighter one to it, at much more recompute
# (docs/DESIGN.md §5.3 and §13: ``peak_table.py``'s ViT row at 0.5).  ``peak_table.py`` flags a measured peak
# more than 3% above a looser budget's; 2% leaves the rest to the simulator's error between two plans.  The
# exchange keeps the ties that cost peak for little (a plan slightly higher for much less recompute can end above
# PyTorch's peak at the same bytes; ``peak_table.py``'s GPT-2 row).
BUDGET_TIE = PeakTie(tolerance=0.02, exchange=10.0)


# Plans a raised budget choice also judges run another way (``monotone_choice``'s ``lowered``): the lowest by
# their own peak, and the plans tied with the last of them, up to ``LOWERED_TIED_MOST`` in all: among tied
# checkpointed plans the one that segments lowest need not be the fastest (docs/DESIGN.md §13: ``peak_table.py``'s
# llama_stack row at PyTorch's 0.5 bytes).  Each costs a split and up to ``passes/choice/peak.py``'s
# ``SEGMENTATIONS_SIMULATED`` simulations.
LOWERED_CANDIDATES = 3
LOWERED_TIED_MOST = 6


@dataclasses.dataclass(frozen=True)
class PeakOnly:
    """A way of running plans known by its peak alone (``peak(plan)``), each at its own seconds: ``monotone_choice``'s
    ``lowered`` as ``choice.segmented.Segmentations`` is one, whose ``seconds`` add what the segments recompute."""

    peak: object  # plan -> its peak run that way (infinity where it cannot be)

    def seconds(self, plan: Plan) -> float:
        return plan.seconds


def _lowest(plans: list[Plan], peak_of, lowered, most_saved: int = 0) -> tuple[Plan, float]:
    """(the plan of ``plans`` with the lowest peak, that peak), counting ``lowered.peak`` for the
    ``LOWERED_CANDIDATES`` lowest by their own peak and those tied with the last of them, and for the ``most_saved``
    plans saving the most bytes; ties to the faster, as each would run (``lowered.seconds``: two plans segmented to
    one peak can differ in the FLOPs their segments add)."""
    ranked = sorted(plans, key=lambda p: (peak_of(p), p.seconds))
    peaks = {plan_key(p): peak_of(p) for p in ranked}
    seconds = {plan_key(p): p.seconds for p in ranked}
    last = peak_of(ranked[min(LOWERED_CANDIDATES, len(ranked)) - 1]) if ranked else None
    tied = ranked[:LOWERED_CANDIDATES] + [p for p in ranked[LOWERED_CANDIDATES:] if peak_of(p) == last]
    tried = tied[:LOWERED_TIED_MOST]
    keys = {plan_key(p) for p in tried}
    tried += [p for p in sorted(ranked, key=lambda p: -p.saved_bytes)[:most_saved] if plan_key(p) not in keys]
    for p in tried if lowered is not None else ():
        if lowered.peak(p) < peaks[plan_key(p)]:
            peaks[plan_key(p)], seconds[plan_key(p)] = lowered.peak(p), lowered.seconds(p)
    best = min(ranked, key=lambda p: (peaks[plan_key(p)], seconds[plan_key(p)]))
    return best, peaks[plan_key(best)]


def monotone_choice(shortlist, default: Plan, target: int, peak_of, lowered=None, tie: PeakTie = STRICT) -> PeakChoice:
    """The fastest plan of ``shortlist`` (a list, fastest first, or a ``BudgetShortlist``) within ``target`` saved
    bytes whose peak (``peak_of(plan)``, simulated on demand) is at most that of the plan chosen at every looser budget,
    the default plan's included; where none is, the lowest-peak plan within ``target`` (``raised``), a plan's peak
    then being ``lowered.peak(plan)`` where that is lower (the plan run another way, e.g. recomputed segment by segment,
    as the budget's choice will run it: ``_lowest``); a tighter budget is held to that peak too.

    Walking the budgets from the loosest down, the chosen plan changes only where a plan stops fitting, so the
    walk visits each distinct saved-bytes level of the shortlist above ``target``, then ``target``.  The shortlist
    does not depend on the budget, so the chosen peak is non-increasing as the budget goes down, except where a
    budget leaves no plan that low (then it is the lowest the budget allows, and ``raised`` says so).

    ``tie``: a faster plan within ``tie.tolerance`` of that peak counts as no higher where ``tie.worth`` it (the
    bound itself stays the lowest peak chosen, so the allowance never compounds: every choice is within it of every
    looser one)."""
    listed = shortlist if isinstance(shortlist, BudgetShortlist) else _Listed(shortlist)
    bound = peak_of(default)
    choice = PeakChoice(default, bound, bound, False)
    if target >= default.saved_bytes:
        return choice
    target = max(target, listed.fewest_bytes())  # an unreachable budget: the fewest bytes
    levels = {b for b in listed.levels() if target < b < default.saved_bytes}
    caps = [*sorted(levels, reverse=True), target]
    bounds = []  # the bound before each cap
    for cap in caps:
        bounds.append(bound)
        plan, peak = _step(listed, cap, bound, peak_of, lowered, tie)
        choice = PeakChoice(plan, peak, bound, not tie.within(peak, bound))
        bound = min(bound, choice.peak)
    # caps no shortlisted plan has (``BudgetShortlist.levels``) just above the target repeat its step, lowering
    # the bound to its own peak: the looser budgets' peak is the bound before the first of them
    last = len(caps) - 1
    while last > 0 and not listed.is_level(caps[last - 1]):
        last -= 1
    return PeakChoice(choice.plan, choice.peak, bounds[last], not tie.within(choice.peak, bounds[last]))


def _step(
    listed, cap: int, bound: float, peak_of, lowered, tie: PeakTie, most_saved_lowered: int = 0
) -> tuple[Plan, float]:
    """(plan, peak) of one step of ``monotone_choice``: the fastest plan within ``cap`` at most ``bound`` high, or
    the lowest (``_lowest``: ``raised``; also run the other way: ``most_saved_lowered`` plans); in its place the
    fastest plan within the tie's tolerance where it is worth it.  Stops at the first plan at most ``bound`` high, as
    a strict walk does (``BudgetShortlist.reached``)."""
    tied = strict = None
    for p in listed.fitting(cap):
        if peak_of(p) <= bound:
            strict = p
            break
        if tied is None and tie.within(peak_of(p), bound):
            tied = p
    plan, peak = (
        (strict, peak_of(strict))
        if strict is not None
        else _lowest(list(listed.fitting(cap)), peak_of, lowered, most_saved_lowered)
    )
    if tied is not None and tie.worth(tied, peak_of(tied), plan, peak):
        return tied, peak_of(tied)
    return plan, peak


def one_step(
    plans: list[Plan], cap: int, bound: float, peak_of, lowered=None, tie: PeakTie = STRICT, most_saved_lowered: int = 0
):
    """(plan, peak) of ``monotone_choice``'s step at ``cap`` over ``plans`` alone, under ``bound`` (the looser
    budgets' lowest peak): the fastest within ``cap`` at most ``bound`` high, else the lowest (``_lowest``; the
    ``most_saved_lowered`` plans saving the most bytes also run the ``lowered`` way, whatever their own peak)."""
    return _step(_Listed(fastest_first(plans)), cap, bound, peak_of, lowered, tie, most_saved_lowered)
