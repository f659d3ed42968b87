"""Checkpoint plans (no torch): break recompute chains by keeping a narrow "waist" of the forward every so often.

A bytes-only cut has no notion of when memory is held.  Its fewest-bytes plan recomputes the whole forward from
the inputs, and since backward recomputes lazily, the first backward node already needs the last layer, so the
whole forward is recomputed at once and held: the peak of keeping everything.  Chen et al. (2016, "Training Deep
Nets with Sublinear Memory Cost") keep a checkpoint every ~sqrt(N) layers instead; backward then recomputes one
segment at a time, and the activation peak grows like sqrt(N).

Here a checkpoint is a *separator*: the forward values computed so far that a later forward value reads (the
"open" set after a position of the forward, in graph order).  Everything after it depends on what came before
only through the open set, so forbidding its recomputation lets backward rebuild each segment from its start.  In a
residual stack the narrowest open sets are the block boundaries (one hidden state, plus whatever every layer
shares, such as rotary tables and masks); nothing here knows what a block is.

``segment_checkpoints`` places checkpoints greedily for a target segment size (the forward bytes between two
checkpoints), at the narrowest open set within each window of one to two segment sizes; ``checkpoint_grid`` does it
for a range of sizes.  The min-cut then prices everything else as usual within the constraint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .parametric import ParametricProblem

# Segment counts tried (forward bytes / segment size): a geometric grid up to one checkpoint per few layers.
SEGMENT_COUNTS = (2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64)


@dataclass(frozen=True)
class Waists:
    positions: tuple[int, ...]  # forward values (value indices), in graph order
    cumulative_bytes: tuple[int, ...]  # forward bytes allocated up to and including each position
    open_sets: tuple[tuple[int, ...], ...]  # the open set after each position
    open_bytes: tuple[int, ...]


def forward_waists(problem: ParametricProblem, forward: Sequence[bool]) -> Waists:
    """The open set after every forward value: values already computed that a later forward value reads."""
    last_reader: dict[int, int] = {}
    for u, w in problem.edges:
        if forward[u] and forward[w]:
            last_reader[u] = max(last_reader.get(u, -1), w)
    positions = [v for v in range(problem.num_values) if forward[v]]
    seen_storage: set[int] = set()
    cumulative, running = [], 0
    open_sets, open_bytes = [], []
    current: dict[int, int] = {}  # open value -> its last forward reader
    for v in positions:
        k = problem.storage[v]
        if k >= 0 and k not in seen_storage:
            seen_storage.add(k)
            running += problem.storage_bytes[k]
        cumulative.append(running)
        if last_reader.get(v, -1) > v:
            current[v] = last_reader[v]
        for u in [u for u, last in current.items() if last <= v]:
            del current[u]
        members = tuple(sorted(current))
        open_sets.append(members)
        storages = {problem.storage[u] for u in members if problem.storage[u] >= 0}
        open_bytes.append(sum(problem.storage_bytes[k] for k in storages))
    return Waists(tuple(positions), tuple(cumulative), tuple(open_sets), tuple(open_bytes))


def segment_checkpoints(waists: Waists, segment_bytes: int) -> tuple[int, ...]:
    """Indices into ``waists.positions`` of the checkpoints for one target segment size: after each checkpoint,
    the narrowest open set among the positions one to two segment sizes further on (and half a segment before the
    end of the forward, so that the last segment is not a sliver)."""
    total = waists.cumulative_bytes[-1]
    chosen: list[int] = []
    start_bytes, i, n = 0, 0, len(waists.positions)
    while total - start_bytes >= 1.5 * segment_bytes:
        window = []
        while i < n and waists.cumulative_bytes[i] - start_bytes < 2 * segment_bytes:
            if segment_bytes <= waists.cumulative_bytes[i] - start_bytes and waists.cumulative_bytes[i] <= total - (
                segment_bytes // 2
            ):
                window.append(i)
            i += 1
        if not window:
            break
        best = min(window, key=lambda j: (waists.open_bytes[j], j))
        chosen.append(best)
        start_bytes = waists.cumulative_bytes[best]
        i = best + 1
    return tuple(chosen)


def with_checkpoints(problem: ParametricProblem, waists: Waists, checkpoints: Sequence[int]) -> ParametricProblem:
    """The problem in which the open sets at ``checkpoints`` may not be recomputed (``without_recompute``)."""
    return without_recompute(problem, [v for j in checkpoints for v in waists.open_sets[j]])


def without_recompute(problem: ParametricProblem, values: Iterable[int]) -> ParametricProblem:
    """The problem in which ``values`` may not be recomputed (so they are kept when a later value is recomputed).
    A value that may not be saved (``traffic_seconds`` None: MUST_RECOMPUTE, or sharing a storage with one) stays
    recomputable: forcing it would leave the cut no way to supply a backward that reads it
    (tests/robustness/test_must_recompute_fuzz.py)."""
    forced = {v for v in values if problem.traffic_seconds[v] is not None}
    recompute = tuple(None if v in forced else r for v, r in enumerate(problem.recompute_seconds))
    return replace(problem, recompute_seconds=recompute)


def checkpoint_grid(problem: ParametricProblem, forward: Sequence[bool]) -> list[ParametricProblem]:
    """Constrained problems for a range of segment counts (distinct checkpoint sets only)."""
    waists = forward_waists(problem, forward)
    if not waists.positions:
        return []
    total = waists.cumulative_bytes[-1]
    seen: set[tuple[int, ...]] = set()
    out = []
    for count in SEGMENT_COUNTS:
        checkpoints = segment_checkpoints(waists, max(1, total // count))
        if checkpoints and checkpoints not in seen:
            seen.add(checkpoints)
            out.append(with_checkpoints(problem, waists, checkpoints))
    return out
