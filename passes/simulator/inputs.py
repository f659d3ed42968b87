"""SimulatorInputs: everything a simulated step depends on beyond its graphs, as one frozen value.

A simulated peak depends on which Inductor backend compiles the graphs (its rules, ``backends/``), on what
Inductor's wrapper does with a dead buffer (``buffer_reuse``: freed, or pooled within fxremat's estimate of the
allocated bytes or within stock Inductor's; ``_torch_private/buffer_reuse.py``), on whether Inductor reorders a
graph for peak memory (``reorders_for_peak``, ``phase_reorder.py``) and how its peak estimate counts a graph's
outputs (``estimate_counts_outputs``, a fact of the torch release), on what Inductor's per-graph layout decision
reads besides the graph (``layout_optimisation``, ``forces_layout_optimisation``, ``mkldnn_enabled``: the decision
is Inductor's own, replayed from these values, ``layout.layout_optimised``), and on whether the backward is handed
over reordered for fewer C++ units (``joins_kernel_runs``, ``rewrite/cpp_units.py``).  The simulator reads these
from the value it is given and from nothing else: no node's device, no live Inductor config, no context variable;
a caller that asks another layout changes the value (``rewrite/layout_choice.py``), never Inductor's config.
``fxremat/partition.py`` builds the value once per partition, from the compile's config, and passes it down; a
caller that names none (a test, a benchmark) gets ``SimulatorInputs.default``: Inductor's defaults for the graph's
device, as fxremat's compile under them would be simulated.  docs/DESIGN.md §6.0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.fx as fx

from .. import _torch_private as tp
from .backends import backend_for_device, device_type_of_graph
from .rules import SchedulingRules


@dataclass(frozen=True)
class SimulatorInputs:
    backend: SchedulingRules  # the rules of the Inductor backend that compiles the graphs
    buffer_reuse: str | None  # ``tp.ALLOCATED``, ``tp.ESTIMATED`` or None (dead buffers freed at once)
    reorders_for_peak: bool  # Inductor's ``reorder_for_peak_memory`` applies to each graph
    estimate_counts_outputs: bool  # Inductor's peak estimate holds a graph output from its kernel on (the release's)
    # what Inductor's layout decision (``layout.layout_optimised``) reads besides the graph: its config's
    # ``layout_optimization`` and ``force_layout_optimization``, and ``torch.backends.mkldnn.enabled``
    layout_optimisation: bool
    forces_layout_optimisation: bool
    mkldnn_enabled: bool
    joins_kernel_runs: bool = False  # the backward is judged in the order ``rewrite/cpp_units.py`` hands over
    caller_bytes: int | None = None  # the caller's work between the graphs; None: estimated (``boundary.py``)

    @classmethod
    def default(cls, device_type: str) -> SimulatorInputs:
        """fxremat's compile of a graph on ``device_type`` under Inductor's default config (the running torch's)."""
        return cls(
            backend=backend_for_device(device_type),
            buffer_reuse=tp.default_buffer_reuse(),
            reorders_for_peak=bool(tp.inductor_default("reorder_for_peak_memory")),
            estimate_counts_outputs=tp.inductor_estimate_counts_outputs(),
            layout_optimisation=bool(tp.inductor_default("layout_optimization")),
            forces_layout_optimisation=bool(tp.inductor_default("force_layout_optimization")),
            mkldnn_enabled=tp.MKLDNN_ENABLED_BY_DEFAULT,
        )

    def with_changes(self, **changes) -> SimulatorInputs:
        return replace(self, **changes)


def inputs_for(gm: fx.GraphModule, inputs: SimulatorInputs | None) -> SimulatorInputs:
    """``inputs``, or where a caller named none, ``SimulatorInputs.default`` for ``gm``'s device."""
    return inputs if inputs is not None else SimulatorInputs.default(device_type_of_graph(gm))
