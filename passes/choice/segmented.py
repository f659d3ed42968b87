"""Running a plan's backward segment by segment (``segments.lowest_peak_segments``: checkpoints in backward, the
forward recomputed one segment at a time), where that lowers its peak: ``segmented_split`` for
``backward_segments=True``, and ``Segmentations`` for the budgets' choices."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .. import _torch_private as tp
from ..rewrite.segments import lowest_peak_segments, segment_recompute_flops, segment_recompute_seconds
from ..solver.budget import Plan
from ..solver.shortlists import plan_key
from .judged import JudgedPlans

log = logging.getLogger(__name__)

# Backward checkpoint sets (passes/rewrite/segments.py) simulated for a plan that recomputes in segments, lowest
# estimated peak first: each costs a simulation (about 2 s at 48 blocks, docs/DESIGN.md §5.4).
SEGMENTATIONS_SIMULATED = 4


@dataclass
class Segmentations:
    """Each plan's lowest-peak segmentation (``_segmentation``: recipe, simulation, report fields, or None where it
    has none), made on first demand and kept."""

    simulated: JudgedPlans
    request: object
    profile: object
    found: dict = field(default_factory=dict)  # plan key -> (plan, its segmentation or None)
    added: dict = field(default_factory=dict)  # plan key -> estimated seconds its segments add

    def peak(self, plan: Plan) -> float:
        """The plan's peak run segment by segment in backward, or infinity where it cannot be."""
        key = plan_key(plan)
        if key not in self.found:
            self.found[key] = (plan, _segmentation(self.simulated, plan, self.request, self.profile))
        segmentation = self.found[key][1]
        return segmentation[1].peak_bytes if segmentation is not None else float("inf")

    def seconds(self, plan: Plan) -> float:
        """The plan's estimated seconds run segment by segment (its own and what its segments recompute more)."""
        key = plan_key(plan)
        if key not in self.added:
            self.peak(plan)  # its segmentation, made on first demand
            segmentation = self.found[key][1]
            recipe = self.simulated.recipe_and_simulation(plan)[0] if segmentation is not None else None
            added = segment_recompute_seconds(recipe, segmentation[0], self.profile) if recipe is not None else 0.0
            self.added[key] = added
        return plan.seconds + self.added[key]

    def of(self, plan: Plan):
        return self.found.get(plan_key(plan), (plan, None))[1]


def _segmentation(simulated: JudgedPlans, plan: Plan, request, profile):
    """The plan's lowest-peak segmentation (``lowest_segmentation``: recipe, simulation, report fields), or None
    where its split cannot be segmented or simulated (then it is not a way to run the plan)."""
    try:
        recipe, simulation = simulated.recipe_and_simulation(plan)
        if recipe is None or simulation is None:  # a plan that cannot be simulated is not judged
            return None
        return lowest_segmentation(
            recipe, request.num_fwd_outputs, profile, simulation, simulated.inputs, simulated.memory
        )
    except Exception as error:
        log.debug("segmenting a raised budget choice failed: %s", error, exc_info=True)
        return None


def segmented_split(recipe, num_fwd_outputs: int, profile, inputs=None):
    """The lowest-peak segmentation of a split's backward, built: ((fw, bw, recipe), its simulation, report fields)."""
    segmented, peak, fields = lowest_segmentation(recipe, num_fwd_outputs, profile, inputs=inputs)
    return built(segmented), peak, fields


def lowest_segmentation(recipe, num_fwd_outputs: int, profile, simulation=None, inputs=None, memory=None):
    """The recipe or its lowest-peak segmentation (``segments.lowest_peak_segments``, at most
    ``SEGMENTATIONS_SIMULATED`` tried; ``simulation``: the recipe's own, where known; ``memory``: the joint graph's
    ``JointMemory``, where made), its simulation and its report fields: (recipe, simulation, fields)."""
    segmented, peak = lowest_peak_segments(
        recipe, num_fwd_outputs, profile, SEGMENTATIONS_SIMULATED, simulation, inputs, memory
    )
    fields = dict(
        segment_recompute_flops=segment_recompute_flops(recipe, segmented, profile),
        backward_checkpoints=tuple(sorted(n.name for n in segmented.bw_checkpoints)),
    )
    return segmented, peak, fields


def built(recipe) -> tuple:
    with tp.lazy_graph_modules():
        return (*recipe.build(), recipe)
