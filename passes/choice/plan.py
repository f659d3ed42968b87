"""choose_plan: from settings (price, budget, solver) to one plan over a ParametricProblem, plus report fields.

Budget semantics (docs/DESIGN.md §5.1): ``None`` or ``1.0`` is the default plan (the cut at ``memory_price``); a
float ``f`` in [0, 1) is ``fewest + f * (default - fewest)`` saved bytes, where ``fewest`` is the fewest-bytes plan
(price -> infinity) and ``default`` the default plan's bytes; an int is absolute saved bytes per joint graph.
An unreachable budget: one warning, the fewest-bytes plan, ``budget_met=False``.
"""

from __future__ import annotations

import dataclasses
import logging

from ..graph.costs import DeviceProfile
from ..solver.budget import Plan, SolveCache, budget_target, frontier
from ..solver.checkpoints import checkpoint_grid
from ..solver.milp import seconds_below
from ..solver.mincut import InfeasibleCutError
from ..solver.parametric import ParametricProblem
from ..solver.shortlists import fastest_first
from ..solver.solvers import SOLVERS, Budget, cheapest_within, cheapest_within_each
from .settings import ChoiceSettings, prices, warn_unreachable

log = logging.getLogger(__name__)


def budget_target_bytes(budget: float | int, default: Plan, fewest: Plan) -> int:
    return budget_target(budget, default.saved_bytes, fewest.saved_bytes)


def choose_plan(
    problem: ParametricProblem,
    settings: ChoiceSettings,
    profile: DeviceProfile,
    graph_id: str,
    default_problem: ParametricProblem | None = None,
) -> tuple[Plan, dict]:
    """The plan (``memory_budget``'s, or without one the default plan) and its report fields.  ``default_problem``:
    where given, the no-budget plan is solved on it (the default's rule, docs/DESIGN.md §4.5), a budget's ends and
    the frontier still on ``problem``; a rule that leaves no finite cut is dropped."""
    price, max_price = prices(settings, profile)
    budget = settings.memory_budget
    fields: dict = {}
    cache = SolveCache(problem)  # the budget search and the frontier share their max-flows
    solver = SOLVERS[settings.solver]
    if budget is None or budget == 1.0:
        plan = _default_plan(solver, problem, default_problem, price, cache)
        fields["default_plan_saved_bytes"] = plan.saved_bytes
    else:
        default = solver.default(problem, price, cache)
        fewest = cache.at(max_price)
        target = budget_target_bytes(budget, default, fewest)
        plan, met = solver.within(problem, price, Budget(target, max_price, default, fewest), cache)
        if not met:
            warn_unreachable(graph_id, target, budget, fewest.saved_bytes)
        fields.update(budget_bytes=target, budget_met=met, fewest_saved_bytes=fewest.saved_bytes)
        fields["default_plan_saved_bytes"] = default.saved_bytes
    fields["plan_method"] = plan.method
    if settings.compare_default:  # a report-oriented run: also show the frontier
        fields["frontier"] = frontier_field(problem, settings, profile, cache)
    return plan, fields


def _default_plan(solver, problem: ParametricProblem, default_problem, price: float, cache: SolveCache) -> Plan:
    if default_problem is None or default_problem is problem:
        return solver.default(problem, price, cache)
    try:
        return solver.default(default_problem, price, SolveCache(default_problem))
    except InfeasibleCutError:
        log.debug("the default's rule leaves no finite cut: the plan without it")
        return solver.default(problem, price, cache)


def frontier_field(
    problem: ParametricProblem, settings: ChoiceSettings, profile: DeviceProfile, cache: SolveCache
) -> tuple:
    """The report's ``frontier``: (saved bytes, estimated recompute seconds, memory_price) per vertex, the same axes
    as the report's own figures."""
    price, max_price = prices(settings, profile)
    points = frontier(problem, price, max_price, cache=cache)
    return tuple((p.saved_bytes, p.recompute_seconds, p.price * profile.mem_bandwidth) for p in points)


# Budgets (fractions of the way from the fewest-bytes plan to the default) whose MILP-refined plans join the
# frontier's vertices as candidates for a peak budget: the vertices alone jump over the middle of the range.  0.5
# and 0.2 are where PyTorch users set `activation_memory_budget` most; at a fraction off this grid the walk takes the
# next refined plan below the cap, so 0.2 on the grid spares that budget a plan recomputed segment by segment
# at the same simulated peak.  0.35 splits the widest gap left; 0.25 stays, as the plan it finds is the fastest at
# the same peak under some looser caps (docs/DESIGN.md §13: ``peak_table.py``'s stack, block_sdpa and T5 rows).
PEAK_CANDIDATE_FRACTIONS = (0.75, 0.5, 0.35, 0.25, 0.2, 0.1)


@dataclasses.dataclass
class Refinements:
    """The price search's candidate plans, spanning default to fewest bytes: the frontier's vertices and the
    MILP-refined plans at ``PEAK_CANDIDATE_FRACTIONS`` (solved on ``refined``: ``problem``, or the ``sums_problem``
    of ``refinements_of``), made in that order, as many as asked for; fastest (estimated) first."""

    problem: ParametricProblem
    refined: ParametricProblem
    vertices: list[Plan]
    price: float  # the default price
    budgets: list[Budget]  # one per fraction, with ``refined``'s default and fewest-bytes plans
    cache: SolveCache
    made: list = dataclasses.field(default_factory=list)  # (plan, its MILP's dual bound) per budget, in order

    def plans(self, count: int) -> list[Plan]:
        """The vertices and the first ``count`` refinements."""
        if count > len(self.made):
            rest = self.budgets[len(self.made) : count]
            self.made += cheapest_within_each(self.refined, self.price, rest, self.cache)
        return fastest_first([*self.vertices, *self._priced([plan for plan, _ in self.made[:count]])])

    def every(self) -> list[Plan]:
        """Every candidate, all the refinements made."""
        return self.plans(len(self.budgets))

    @property
    def targets(self) -> list[int]:
        """The refinements' saved-bytes targets, in the order they are made."""
        return [budget.target for budget in self.budgets]

    def slower_than(self) -> float:
        """A lower bound on the seconds of every plan the refinements not made yet can give (infinity where none
        is left): each is within its target, at most the made ones', so its MILP objective is at least their dual
        bounds (``milp.seconds_below``); a target the price search cannot meet gives the fewest-bytes plan."""
        rest = self.targets[len(self.made) :]
        if not rest:
            return float("inf")
        dual = max((bound for _, bound in self.made), default=float("-inf"))
        bound = seconds_below(self.refined, self.price, dual, max(rest)) if dual > float("-inf") else dual
        fewest = self.budgets[0].fewest
        if fewest.saved_bytes > min(rest):
            bound = min(bound, self._priced([fewest])[0].seconds)
        return bound

    def _priced(self, plans: list[Plan]) -> list[Plan]:
        return priced_by(self.problem, plans) if self.refined is not self.problem else plans


def refinements_of(
    problem: ParametricProblem,
    prices: tuple[float, float],
    cache: SolveCache | None = None,
    sums_problem: ParametricProblem | None = None,
) -> Refinements:
    """The candidate plans of ``problem`` between ``prices`` (the default's and the one standing for infinity), its
    refinements made on demand (``Refinements.plans``, ``every``).  ``cache``: the caller's max-flows, shared.
    ``sums_problem``: ``problem`` with its block sums' saves priced at one read (``stored_sums.reads_only``), where
    the graph has block sums: its MILP-refined plans stand in for the plain problem's, priced by ``problem``.
    Saving a block sum in place of the projection it adds keeps the same bytes but spares backward recomputing the
    residual stream, so these plans run with a lower step peak, and a peak-judged budget can take them between the
    frontier's vertices (docs/DESIGN.md §5.3).  (Its frontier's plans are left out: a few percent lower than the
    default's peak at nearly its bytes, they held every tighter budget of ``shortlists.monotone_choice`` below
    them, where the plans between the vertices peak as the default does.)"""
    price, max_price = prices
    cache = cache or SolveCache(problem)
    plans = frontier(problem, price, max_price, cache=cache)
    default, fewest = plans[0], plans[-1]
    refined, ends, refined_cache = problem, (default, fewest), cache
    if sums_problem is not None:
        refined_cache = SolveCache(sums_problem)
        refined, ends = sums_problem, (refined_cache.at(price), refined_cache.at(max_price))
    targets = [budget_target_bytes(fraction, default, fewest) for fraction in PEAK_CANDIDATE_FRACTIONS]
    budgets = [Budget(target, max_price, *ends) for target in targets]
    return Refinements(problem, refined, plans, price, budgets, refined_cache)


def priced_by(problem: ParametricProblem, plans: list[Plan]) -> list[Plan]:
    """``plans`` (found on a repriced copy of ``problem``: ``stored_sums.reads_only``) with ``problem``'s own
    seconds, as every other plan (``default.block_sums_plan`` too)."""
    return [dataclasses.replace(p, seconds=problem.seconds(p.saved, p.recomputed)) for p in plans]


# Solves per checkpoint set: its plans from the default price to the fewest bytes (within the checkpoint constraint).
CHECKPOINT_FRONTIER_SOLVES = 6


@dataclasses.dataclass
class PeakCandidates:
    """``peak_candidates``: the price search's plans (``Refinements``, their MILP refinements made on demand) and
    the checkpointed ones."""

    refinements: Refinements
    checkpointed: list[Plan]

    def plans(self, count: int) -> list[Plan]:
        """``peak_candidates`` with the first ``count`` refinements."""
        return fastest_first([*self.refinements.plans(count), *self.checkpointed])

    def every(self) -> list[Plan]:
        """Every candidate, all the refinements made."""
        return self.plans(len(PEAK_CANDIDATE_FRACTIONS))


def peak_candidates(
    problem: ParametricProblem,
    forward: list[bool],
    prices: tuple[float, float],
    budget_bytes: int | None = None,
    cache: SolveCache | None = None,
    sums_problem: ParametricProblem | None = None,
) -> PeakCandidates:
    """Candidates for a peak budget: the price search's plans (``refinements_of``, with ``sums_problem``) and, for
    a range of checkpoint spacings (``checkpoints.py``), the plans that keep those checkpoints and recompute the
    segments between them lazily (the bytes-only frontier has no plan whose recompute is spread over backward).
    With a saved-bytes budget too, each checkpoint set also gets its cheapest plan within that budget.  The MILP
    refinements are made as ``PeakCandidates.plans`` asks for them (``PeakCandidates.every``: all)."""
    refinements = refinements_of(problem, prices, cache, sums_problem)
    checkpointed: list[Plan] = []
    for constrained in checkpoint_grid(problem, forward):
        found = constrained_plans(constrained, prices, budget_bytes)
        checkpointed.extend(dataclasses.replace(plan, method="checkpoints") for plan in found)
    return PeakCandidates(refinements, checkpointed)


def constrained_plans(
    constrained: ParametricProblem, price_range: tuple[float, float], budget_bytes: int | None
) -> list[Plan]:
    """A constrained problem's plans (a checkpoint set's, ``checkpoints.with_checkpoints``; a front-loaded one's,
    ``front_saves.py``): its frontier from the default price to the fewest bytes (``CHECKPOINT_FRONTIER_SOLVES``
    solves) and, with ``budget_bytes``, its cheapest plan within them where it meets them."""
    price, max_price = price_range
    cache = SolveCache(constrained)
    found = frontier(constrained, price, max_price, max_solves=CHECKPOINT_FRONTIER_SOLVES, cache=cache)
    if budget_bytes is not None:
        plan, met = cheapest_within(constrained, price, Budget(budget_bytes, max_price, found[0], found[-1]), cache)
        if met:
            found.append(plan)
    return found
