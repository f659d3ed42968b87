"""Per-region budgets (``torch.autograd.graph.region_activation_memory_budget`` around parts of a graph): the plan
where each region keeps at most its own budget, in one solve with the rest of the graph
(``passes/solver/region_search.py``).

A storage belongs to the region its owner (the node whose output it is, ``costs.alias_root``) was traced in, so a
view taken in one region of a value made in another counts where the value was made.  Each region's budget is a
fraction of what that region keeps in fxremat's default plan, from what it keeps in the fewest-bytes plan (0.0), as
one budget over a whole graph is (``budget.budget_target``).  Storages outside every region keep the graph's
own setting: the default price of memory, or a region of their own under the graph's ``memory_budget`` (fxremat's
option, PyTorch's ``activation_memory_budget`` or the legacy marker; bytes count the rest's storages only).

The choice is by saved bytes alone: §5.3's peak check (``memory_budget.py``) is not applied to per-region plans.
"""

from __future__ import annotations

import warnings

from ..graph.costs import node_cost
from ..graph.region_budget import REGION_SOURCE, RegionAnnotations, node_region_budget
from ..solver.region_search import Region, region_bytes, solve_regions
from ..solver.solvers import MILP_REFINE_LIMIT, SOLVERS
from .records import Chooser, Choosing, PlanChoice
from .settings import FxrematBudgetWarning, prices

OUTSIDE = "outside regions"  # the report's name for the storages of no region


def region_name(budget: float) -> str:
    return f"{REGION_SOURCE.rsplit('.', 1)[-1]}({budget!r})"


def storage_regions(flow, annotations: RegionAnnotations, profile) -> dict[float | None, list[int]]:
    """Storage ids by the budget of the region their owner was traced in (None: outside every region); every
    region of ``annotations`` has an entry, empty where it keeps no storage of its own."""
    problem = flow.parametric
    nodes = {n.name: n for n in flow.nodes[0].graph.nodes} if flow.nodes else {}
    groups: dict[float | None, list[int]] = {b: [] for b in annotations.budgets}
    groups[None] = []
    seen: set[int] = set()
    for v, node in enumerate(flow.nodes):
        k = problem.storage[v]
        if k < 0 or k in seen:
            continue
        seen.add(k)
        owner = nodes.get(node_cost(node, profile).alias_root, node)
        groups.setdefault(node_region_budget(owner), []).append(k)
    return groups


def choose_plan_for_regions(c: Choosing) -> PlanChoice:
    """The plan where each region keeps within its own budget, by saved bytes alone."""
    flow, settings, profile, request, annotations = c.flow, c.settings, c.profile, c.request, c.regions
    problem = flow.parametric
    groups = storage_regions(flow, annotations, profile)
    names = [region_name(b) for b in annotations.budgets]
    regions = [Region(tuple(groups[b]), b) for b in annotations.budgets]
    rest = Region(tuple(groups[None]), settings.memory_budget)
    if settings.memory_budget not in (None, 1.0):
        names.append(OUTSIDE)
        regions.append(rest)
    price, top = prices(settings, profile)
    result = solve_regions(
        problem,
        regions,
        price,
        top,
        exact=problem.num_values <= MILP_REFINE_LIMIT,
        exact_only=SOLVERS[settings.solver].exact,
    )
    rows = [
        (name, region.budget, saved, target, default, fewest)
        for name, region, saved, target, default, fewest in zip(
            names, regions, result.saved_bytes, result.targets, result.default_bytes, result.fewest_bytes
        )
    ]
    if len(regions) == len(annotations.budgets):  # the rest keeps the default price: what it keeps, unbounded
        default_rest = region_bytes(problem, result.default_plan.saved, rest)
        rows.append((OUTSIDE, None, region_bytes(problem, result.plan.saved, rest), None, default_rest, None))
    if not result.met:
        over = [f"{r[0]} (at most {r[3]} bytes, fewest {r[5]})" for r in rows if r[3] is not None and r[5] > r[3]]
        warnings.warn(
            f"fxremat: {request.graph_id} cannot keep every region within its budget: {', '.join(over)}. "
            "Using the fewest-bytes plan.",
            FxrematBudgetWarning,
            stacklevel=5,
        )
    fields = dict(
        region_budgets=tuple(rows),
        budget_met=result.met,
        default_plan_saved_bytes=result.default_plan.saved_bytes,
        plan_method=result.plan.method,
    )
    return PlanChoice(result.plan, fields)


CHOOSER = Chooser("per-region budgets", lambda c: c.regions is not None, choose_plan_for_regions)
