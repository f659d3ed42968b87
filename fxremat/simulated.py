"""The report's simulated-peak fields: a liveness simulation of a split (``passes/simulator/liveness.py``), run now or
deferred to the first read of its fields (``report.Deferred``), so that a compile whose report nobody reads never
runs it; and ``gc_paused``, which every partition and every deferred simulation runs under."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator

import torch.fx as fx

from fxremat_passes.graph.ops import CONVOLUTION
from fxremat_passes.rewrite.split import SplitRecipe
from fxremat_passes.simulator.liveness import PeakEstimate, simulate_step

from .report import BASELINE_PEAK_FIELDS, PEAK_FIELDS, Deferred, SimulatedPeak

log = logging.getLogger(__name__)


# At most this many points of the simulated memory timeline go into a report (enough for a chart).
TIMELINE_POINTS = 400


def simulate_or_none(
    fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, recopy: bool = True, inputs=None
) -> PeakEstimate | None:
    """The liveness simulation of a split (``inputs``: the partition's ``SimulatorInputs``); informative, so a
    failure is logged, never raised."""
    try:
        return simulate_step(fw, bw, num_fwd_outputs, recopy, inputs=inputs)
    except Exception as error:
        log.debug("memory simulation failed: %s", error, exc_info=True)
        return None


def timeline(peak: PeakEstimate) -> tuple[tuple[str, str, int], ...]:
    """At most about TIMELINE_POINTS evenly spaced points of the timeline, always with the peak and the first
    backward point (a chart marks both)."""
    timeline = peak.timeline
    step = max(1, len(timeline) // TIMELINE_POINTS)
    keep = set(range(0, len(timeline), step))
    keep |= {
        i for i, (phase, node, nbytes) in enumerate(timeline) if (phase, node) == (peak.peak_phase, peak.peak_node)
    }
    keep |= {next((i for i, point in enumerate(timeline) if point[0] == "backward"), 0)}
    return tuple(timeline[i] for i in sorted(keep) if i < len(timeline))


def peak_fields(peak: PeakEstimate | None) -> dict:
    if peak is None:
        return {}
    return dict(
        simulated_peak_bytes=peak.peak_bytes,
        simulated_activation_peak_bytes=peak.activation_peak_bytes,
        simulated_peak_at=f"{peak.peak_phase}:{peak.peak_node}",
        simulated_caller_bytes=peak.caller_bytes,
        memory_timeline=timeline(peak),
    )


def baseline_peak_fields(peak: PeakEstimate | None) -> dict:
    """``peak_fields`` for PyTorch's split, under the report's ``baseline_`` names."""
    fields = {f"baseline_{name}": value for name, value in peak_fields(peak).items()}
    return {name: value for name, value in fields.items() if name in BASELINE_PEAK_FIELDS}


def can_simulate_later(fw_nodes) -> bool:
    """Whether a split's simulation gives the same result after this compile as during it.  It reads the graphs
    (a later simulation builds its own copies from the recipe: Inductor rewrites the ones it gets) and one thing of
    the compile's context: Inductor's layout decision, made from config flags in force during the compile only,
    and always False for a forward without convolutions."""
    return not any(n.target is CONVOLUTION for n in fw_nodes)


def later(compute: Callable[[], dict], names: tuple[str, ...]) -> dict[str, Deferred]:
    """The report fields ``names``, all filled by one ``compute()`` on the first read of any of them (informative:
    a failure is logged and leaves them at their defaults).  ``compute`` simulates with the partition's
    ``SimulatorInputs``, read during the compile: nothing of the compile's context is needed later."""

    def run() -> dict:
        with gc_paused():
            try:
                return compute()
            except Exception as error:
                log.debug("deferred report fields failed: %s", error, exc_info=True)
                return {}

    return dict.fromkeys(names, Deferred(run))


def report_peak(
    fw, bw, num_fwd_outputs: int, recipe: SplitRecipe | None, peak: PeakEstimate | None, inputs=None
) -> SimulatedPeak:
    """The simulated-peak fields of our split: the simulation the peak budget already ran, or one deferred to the
    first read of the fields (from the recipe's own copy of the split, in the order it was split: a reordered
    backward's peak is ``cpp_units.join_kernel_runs``'s), or, where neither applies, one run now."""
    if peak is not None:
        return SimulatedPeak(**peak_fields(peak))
    if recipe is not None and can_simulate_later(recipe.fw_order):
        unjoined = inputs.with_changes(joins_kernel_runs=False) if inputs is not None else None

        def compute() -> dict:
            return peak_fields(simulate_step(*recipe.build(lazy=True), num_fwd_outputs, inputs=unjoined))

        return SimulatedPeak(**later(compute, PEAK_FIELDS))
    return SimulatedPeak(**peak_fields(simulate_or_none(fw, bw, num_fwd_outputs, inputs=inputs)))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while we partition, back on (if it was) afterwards.  A partition
    allocates tens of thousands of small objects (nodes, meta dicts, tuples); every few hundred allocations the
    collector runs, and its full collections walk every object the process holds (FakeTensors, the model, the
    graphs: hundreds of thousands of objects in benchmarks/solve_time.py at 48 blocks).  Those walks were most of the
    partition time there.  On resuming, what the pause allocated is
    handed to the oldest generation (``_to_oldest_generation``); the reference cycles a partition leaves (graphs
    and their nodes) are collected by the next full collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _to_oldest_generation()
            gc.enable()


def _to_oldest_generation() -> None:
    """Move every object the collector tracks into its oldest generation, without a walk: ``gc.freeze`` moves them
    all to the permanent generation, ``gc.unfreeze`` moves that back into the oldest one (two list splices), and
    the youngest generation's count starts again from zero.  Otherwise the first allocation after the pause
    collects the youngest generation, which then holds everything the partition made and kept (the forward and
    backward graphs, their nodes and meta): a walk of tens of thousands of objects that frees almost nothing
    (benchmarks/solve_time.py at 48 blocks).  What the partition returns lives as long as
    the compiled graph; the garbage it left is still found, by the next full collection.  A process that froze
    objects itself (``gc.freeze`` before forking workers) keeps them frozen: it gets the plain collection."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
