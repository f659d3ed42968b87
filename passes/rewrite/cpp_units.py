"""Fewer C++ compilation units for Inductor's CPU backend, at no cost in memory: the backward as fxremat hands it over.

Inductor's CPU backend compiles each run of generated kernels between two extern kernels as one C++ source; a
recompute read by an extern weight-gradient matmul can split what would be one run in two (``kernel_runs.py``).
``join_kernel_runs`` reorders the built backward into one of ``kernel_runs.joined_orders`` where the simulation
keeps it (``liveness._ForwardRun.joined``): no more simulated runs and a simulated step peak no higher than before,
and fewer of one (``liveness._better``).
The planner judged every plan by the same simulation (``SimulatorInputs.joins_kernel_runs``, throughout fxremat's
partition under Inductor on CPU), so the peak a plan was compared by is the peak of the order it runs in: a reorder that
lowers the peak is taken (docs/DESIGN.md §8), and cannot lift one setting's plan over another's (§5.3's monotone
budgets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.fx as fx

from ..simulator.liveness import PeakEstimate, joined_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """What ``join_kernel_runs`` did: whether it reordered the backward, and the simulation of the new order (None
    where the order was kept)."""

    reordered: bool
    estimate: PeakEstimate | None


def join_kernel_runs(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs=None) -> Joined:
    """Reorder ``bw`` in place (recompiled where changed) into the order the simulation keeps (module docstring);
    nothing is simulated for a graph beyond ``kernel_runs.SIMULATED_NODES``.  ``inputs``: the partition's
    ``SimulatorInputs``."""
    joined = joined_step(fw, bw, num_fwd_outputs, inputs)
    if joined is None:
        return Joined(False, None)
    estimate, order = joined
    for before, node in zip(order, order[1:]):
        before.append(node)
    bw.recompile()
    log.debug("backward reordered for fewer C++ units: simulated peak %d", estimate.peak_bytes)
    return Joined(True, estimate)
