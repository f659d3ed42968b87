"""A raised ``memory_budget`` choice looked at again among the front-loaded plans within its bytes
(``front_saves.py``: the default plan's first saves kept, the rest traded), which put the budget's bytes where the
step's peak is (docs/DESIGN.md §5.3)."""

from __future__ import annotations

import dataclasses

from ..graph.roles import Role
from ..solver.budget import Plan
from ..solver.front_saves import front_problems
from ..solver.shortlists import PeakChoice, PeakTie, one_step
from .plan import constrained_plans
from .records import Choosing
from .settings import prices

# Front-loaded plans run segment by segment besides those ``shortlists._lowest`` tries by their own peak: the ones
# saving the most bytes (they recompute least in the segments where the peak is).  Each costs a split and up to
# ``choice/peak.py``'s ``SEGMENTATIONS_SIMULATED`` simulations; ViT's 0.2 found its default's peak at its second and
# third (the first, 4 B larger, segments to 8,293,128).
FRONT_LOWERED_MOST = 4


def front_loaded_choice(
    c: Choosing, choice: PeakChoice, default: Plan, target: int, peak_of, lowered, tie: PeakTie
) -> PeakChoice:
    """``choice`` where it is not raised; else the step ``monotone_choice`` made at ``target`` made again over the
    front-loaded plans within ``target`` and ``choice``'s own plan (``shortlists.one_step``, under the same bound:
    the looser budgets' lowest peak, which these plans never change), taken where its peak is lower.  Only a raised
    choice pays for them: at a looser budget the walk met its bound without them, and a looser budget's choice is
    never made with them, so no tighter budget's bound moves."""
    if not choice.raised:
        return choice
    plans = front_loaded_plans(c, default, target)
    if not plans:
        return choice
    # the front-loaded plans saving the most are also run segment by segment, whatever their own peak: they keep the
    # first blocks' saves so that their backward holds little at the step's peak, which their own peak (everything
    # else recomputed at once) does not show (docs/DESIGN.md §5.4)
    bound = choice.lowest_looser_peak
    plan, peak = one_step([*plans, choice.plan], target, bound, peak_of, lowered, tie, FRONT_LOWERED_MOST)
    if peak >= choice.peak:
        return choice
    return PeakChoice(plan, peak, bound, not tie.within(peak, bound))


def front_loaded_plans(c: Choosing, default: Plan, target: int) -> list[Plan]:
    """For each of ``front_saves.front_problems``: its plans (``plan.constrained_plans``: its frontier and its
    cheapest plan within ``target``) within ``target``, priced by the graph's own problem."""
    problem, price_range = c.flow.parametric, prices(c.settings, c.profile)
    forward = [c.roles.role[n] is Role.FORWARD for n in c.flow.nodes]
    plans: list[Plan] = []
    for constrained in front_problems(problem, forward, default.saved):
        plans += [p for p in constrained_plans(constrained, price_range, target) if p.saved_bytes <= target]
    return [dataclasses.replace(p, method="front", seconds=problem.seconds(p.saved, p.recomputed)) for p in plans]
