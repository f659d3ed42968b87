"""Front-loaded plans (no torch): keep what the default plan keeps in the first part of the forward, and let the
min-cut trade bytes in the rest (docs/DESIGN.md §5.3, peak-safe budgets).

A step's peak is often reached late in backward, at the first blocks' gradients: every weight gradient is
allocated by then, and whatever those blocks' backward recomputes is held on top of them.  A plan that saves fewer
bytes in the first blocks recomputes there, at that peak, while the same bytes given up in the later blocks are
recomputed early in backward, when fewer gradients are held.  The price search and its refinements spread their
saves by cost alone, and the checkpointed plans (``checkpoints.py``) by the forward's waists, so neither puts the
budget's bytes where the peak is: a plan that keeps the default's first saves (a ViT's patch embedding and its
first block's attention inputs among them) and trades the rest can peak as the default plan does at fewer bytes,
where every plan the cut's prices reach peaks higher (docs/DESIGN.md §5.3, with ``peak_table.py``'s ViT and
Mixtral rows).

``front_problems`` forbids recomputing the default plan's first saved values (in graph order), up to each of
``FRONT_FRACTIONS`` of its saved bytes, one constrained problem per fraction; ``choice/front.py`` solves each as a
checkpointed one is (``choice/plan.constrained_plans``) and looks at the plans where a budget's choice is raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .checkpoints import without_recompute
from .parametric import ParametricProblem

# Fractions of the default plan's saved bytes kept, from the forward's start.  Up to 0.4: a budget below the default
# keeps at most its fraction of them, so more would leave a ``memory_budget=0.5`` little to trade.
FRONT_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4)


def front_problems(
    problem: ParametricProblem, forward: Sequence[bool], default_saved: Iterable[int]
) -> list[ParametricProblem]:
    """For each fraction ``f`` of ``FRONT_FRACTIONS`` with a distinct, non-empty set: ``problem`` with the default
    plan's first saved forward values (``default_saved``, in graph order) made non-recomputable
    (``checkpoints.without_recompute``, which never forces a value that may not be saved), as many as keep within
    ``f`` of its saved bytes (distinct storages)."""
    saved = sorted(v for v in set(default_saved) if forward[v] and problem.traffic_seconds[v] is not None)
    total = problem.saved_bytes(saved)
    problems, seen = [], set()
    for fraction in FRONT_FRACTIONS:
        forced = frozenset(_first_within(problem, saved, fraction * total))
        if forced and forced not in seen:
            seen.add(forced)
            problems.append(without_recompute(problem, forced))
    return problems


def _first_within(problem: ParametricProblem, values: list[int], limit: float) -> list[int]:
    """The first of ``values`` whose distinct storages add up to at most ``limit`` bytes."""
    taken, storages, running = [], set(), 0
    for v in values:
        k = problem.storage[v]
        added = problem.storage_bytes[k] if k >= 0 and k not in storages else 0
        if running + added > limit:
            break
        taken.append(v)
        running += added
        if k >= 0:
            storages.add(k)
    return taken
