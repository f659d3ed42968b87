"""The user's plan (no torch): what a user's checkpoint regions ask for, as a cut problem in plain numbers.

``torch.utils.checkpoint`` tags every op of its region ``PREFER_RECOMPUTE`` (selective checkpointing may tag
``MUST_RECOMPUTE``); after the boundary clean-up (``checkpoint_tags.save_checkpoint_boundaries``, PyTorch's
``cleanup_recompute_tags``) the values still tagged are what the user asked backward to recompute, and PyTorch's
partitioner recomputes all of them.  The *user's plan* is fxremat's own cut with exactly those values forbidden
to be saved, everything else priced as usual (docs/DESIGN.md §5.6).

A tagged value is forced only where it can be recomputed: its own recompute is allowed and each input it reads is
saveable or recomputable in turn (a random op's items, say, are neither once forced).  The others stay saveable:
safety wins over the tag, as for ``MUST_RECOMPUTE`` in ``roles.classify``, and the report says why they are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .parametric import ParametricProblem


@dataclasses.dataclass(frozen=True)
class ForcedProblem:
    problem: ParametricProblem  # the same problem, tagged values that can be recomputed no longer saveable
    forced: frozenset[int]  # the tagged values made unsaveable
    unforced: frozenset[int]  # the tagged values that cannot be recomputed, so stay saveable


def force_recompute(problem: ParametricProblem, tagged: Iterable[int]) -> ForcedProblem:
    """``problem`` with every value of ``tagged`` that can be recomputed made unsaveable.  Values are in graph
    order (every edge goes from a lower index to a higher one), so one pass in index order decides each value
    after its inputs."""
    tagged = frozenset(tagged)
    inputs: list[list[int]] = [[] for _ in range(problem.num_values)]
    for u, w in problem.edges:
        if u >= w:
            raise ValueError(f"edge {u} -> {w} is not in graph order")
        inputs[w].append(u)
    traffic = list(problem.traffic_seconds)
    recomputable = [False] * problem.num_values
    forced, unforced = set(), set()
    for v in range(problem.num_values):
        recomputable[v] = problem.recompute_seconds[v] is not None and all(
            traffic[u] is not None or recomputable[u] for u in inputs[v]
        )
        if v in tagged and traffic[v] is not None:
            if recomputable[v]:
                traffic[v] = None
                forced.add(v)
            else:
                unforced.add(v)
    return ForcedProblem(
        dataclasses.replace(problem, traffic_seconds=tuple(traffic)), frozenset(forced), frozenset(unforced)
    )
