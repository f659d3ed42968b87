"""Which layout fxremat hands Inductor for a CPU graph with convolutions: contiguous or channels-last, chosen per
graph by the simulated step peak of the chosen split under each (docs/DESIGN.md §7).

Why per graph: contiguous, mkldnn reads the parameters as they are (no weight copies, no depthwise buffer), but its
weight gradient reorders its operands to a blocked layout, a transient of the input and output gradient's size
(``layout._blocked_reorder_bytes``); channels-last, Inductor copies every weight to channels-last, and mkldnn's
weight gradient allocates two weight-sized buffers (``layout.workspace_bytes``).  Which costs more depends on
whether weights or activations dominate (a weight-heavy ResNet peaks lower contiguous, the activation-heavy
``example("convnet")`` lower channels-last), and no ratio of the two decides it on every net measured, so the
simulator, which prices both, does (docs/DESIGN.md §7, with the nets and how close the simulation is on each).

The decision is made once the plan is chosen (under the contiguous layout, the compile's config) and holds for the
forward and the lazily compiled backward of that graph (``LayoutChoice``, read by
``_torch_private.inner_compile_with_layout``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

if TYPE_CHECKING:  # the simulator loads with the first decision: a warm compile makes a LayoutChoice and no decision
    from ..simulator.inputs import SimulatorInputs
    from ..simulator.liveness import PeakEstimate

# Channels-last must lower the simulated peak by more than this fraction to be chosen: contiguous was also the faster
# step where measured, and the simulator errs by a few percent where the choice is close (docs/DESIGN.md §13:
# benchmarks/investigations/conv_saved.py).
CHANNELS_LAST_MIN_GAIN = 0.02


@dataclass
class LayoutChoice:
    """One compile's layout decision.  ``channels_last``: None until the partitioner decides (Inductor's config as
    patched by the backend then stands: contiguous); ``peaks``: the simulated step peaks (contiguous,
    channels-last) it was decided by."""

    channels_last: bool | None = None
    peaks: tuple[int, int] | None = None

    def inductor_patch(self) -> dict[str, bool]:
        """The Inductor config a compile of this graph runs under (empty: the compile's own)."""
        return {} if self.channels_last is None else {"layout_optimization": self.channels_last}

    def simulator_inputs(self, inputs: SimulatorInputs) -> SimulatorInputs:
        """``inputs`` (the partition's) as the compile of this graph will have them: the same change as
        ``inductor_patch``, made to the simulator's inputs rather than to Inductor's config."""
        return inputs if self.channels_last is None else inputs.with_changes(layout_optimisation=self.channels_last)


def decide_layout(
    choice: LayoutChoice,
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    num_fwd_outputs: int,
    contiguous_peak: int,
    inputs: SimulatorInputs,
) -> PeakEstimate | None:
    """Simulate the split laid out channels-last and record the decision in ``choice``; returns that simulation
    where it wins (the report's peak is then its), else None.  Called on a forward with a convolution, with the
    partition's ``SimulatorInputs`` (the contiguous layout): the simulation asks for Inductor's layout optimisation
    through them (``layout_optimisation``), not through Inductor's config."""
    from ..simulator.liveness import simulate_step

    channels_last = simulate_step(fw, bw, num_fwd_outputs, inputs=inputs.with_changes(layout_optimisation=True))
    choice.peaks = (contiguous_peak, channels_last.peak_bytes)
    choice.channels_last = channels_last.peak_bytes < contiguous_peak * (1 - CHANNELS_LAST_MIN_GAIN)
    return channels_last if choice.channels_last else None
