"""How many chunks a graph's loss region runs in, where the user did not say (docs/DESIGN.md §14): each count's graph
is cut as any graph is (its plan chosen by ``choose``), its split simulated, and the count chosen by those simulated
step peaks.

The partition supplies ``trial(chunks)``: the joint rewritten into ``chunks`` chunks (None: as traced), cut, and
simulated, as a ``ChunkTrial``.  The counts tried are ``CANDIDATE_CHUNKS`` (up to the tokens), in order:

* ``peak_budget`` in bytes: the smallest count (none first) whose plan's simulated peak fits it; where none does, the
  count with the lowest peak.
* ``peak_budget`` a fraction: read on the graph as traced (the bytes its own choice targets), the smallest count that
  fits those bytes; ``0.0`` asks for the lowest peak, so every count is tried and the lowest taken (the smaller count
  where two are equal).
* No budget: a count is taken only while it lowers the simulated peak by at least ``MIN_PEAK_GAIN`` of the peak so
  far, at an estimated step time within ``NEGLIGIBLE_TIME`` of the fastest count tried (the graph as traced among
  them), up to ``DEFAULT_MOST_CHUNKS``.  A count too slow ends the search (more chunks run slower still); a count
  that does not lower the peak does not (the peak is not monotone in the count: a plan or a fusion can change at one
  count and not the next, as in bf16 under Inductor's joint-graph passes).  The chunked form
  computes the gradients in forward and recomputes no matmul, the one form the default may use (budgets could use a
  recomputing one too; there is none yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The chunk counts tried, in order.  Each doubling halves the chunk's logits; past 32 the chunks' logits are a few
# percent of the loss region's bytes and their matmuls run on few rows.
CANDIDATE_CHUNKS = (2, 4, 8, 16, 32)
# With no budget, a count must lower the simulated step peak by this fraction of the peak before it ...
MIN_PEAK_GAIN = 0.02
# ... at an estimated step time no more than this fraction above the fastest count's tried so far.
NEGLIGIBLE_TIME = 0.01
# ... and at most this many chunks: each chunk's kernels are generated and compiled anew (the chunks differ by their
# offsets), a compile cost the step estimate does not see; budgets may take every count (docs/DESIGN.md §14).
DEFAULT_MOST_CHUNKS = 8


@dataclass(frozen=True)
class ChunkTrial:
    """One count's graph, cut and simulated."""

    chunks: int | None  # None: the loss as traced
    peak_bytes: int  # the simulated step peak of its plan
    step_seconds: float  # the estimated step time of its split
    target_bytes: int | None = None  # the bytes ``peak_budget`` meant for this graph, where one was given
    result: object = None  # what the partition keeps of this trial (its split), handed back with the choice


def counts_for(tokens: int) -> tuple[int, ...]:
    """The counts tried for a region of ``tokens`` tokens: each chunk keeps at least one token."""
    return tuple(k for k in CANDIDATE_CHUNKS if k <= tokens)


def choose_chunks(
    trial: Callable[[int | None], ChunkTrial], peak_budget, tokens: int
) -> tuple[ChunkTrial, tuple[ChunkTrial, ...]]:
    """(the chosen trial, every trial made, in order); see the module's docstring for the rule."""
    traced = trial(None)
    tried = [traced]
    counts = counts_for(tokens)
    if peak_budget is None:
        counts = tuple(k for k in counts if k <= DEFAULT_MOST_CHUNKS)
        return _default(trial, traced, tried, counts), tuple(tried)
    lowest_asked = isinstance(peak_budget, float) and peak_budget == 0.0
    target = peak_budget if not isinstance(peak_budget, float) else traced.target_bytes
    if not lowest_asked and target is not None and traced.peak_bytes <= target:
        return traced, tuple(tried)
    for k in counts:
        t = trial(k)
        tried.append(t)
        if not lowest_asked and target is not None and t.peak_bytes <= target:
            return t, tuple(tried)
    return min(tried, key=lambda t: (t.peak_bytes, t.chunks or 1)), tuple(tried)


def _default(trial, traced: ChunkTrial, tried: list, counts) -> ChunkTrial:
    """No budget: a count taken where it lowers the best peak so far by ``MIN_PEAK_GAIN``; the search ends at the
    first count whose estimated step time is beyond ``NEGLIGIBLE_TIME`` of the fastest count taken (the graph as
    traced among them)."""
    best, fastest = traced, traced.step_seconds
    for k in counts:
        t = trial(k)
        tried.append(t)
        if t.step_seconds > fastest * (1 + NEGLIGIBLE_TIME):
            break
        if t.peak_bytes <= best.peak_bytes * (1 - MIN_PEAK_GAIN):
            best, fastest = t, min(fastest, t.step_seconds)
    return best
