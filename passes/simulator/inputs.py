"""SimulatorInputs: everything a simulated step depends on beyond its graphs, as one frozen value.

A simulated peak depends on which Inductor backend compiles the graphs (its rules, ``backends/``), on what
Inductor's wrapper does with a dead buffer (``buffer_reuse``: freed, or pooled within fxremat's estimate of the
allocated bytes or within stock Inductor's; ``_torch_private/buffer_reuse.py``), on whether Inductor reorders a
graph for peak memory (``reorders_for_peak``, ``phase_reorder.py``), and on whether the backward is handed over
reordered for fewer C++ units (``joins_kernel_runs``, ``rewrite/cpp_units.py``).  The simulator reads these from
the value it is given and from nothing else: no node's device, no live Inductor config.  ``fxremat/partition.py``
builds the value once per partition (``for_partition``); a caller that names none (a test, a benchmark) gets the
value Inductor's config in force implies for the graph's device (``SimulatorInputs.now``).  docs/DESIGN.md §6.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace

import torch.fx as fx

from .. import _torch_private as tp
from .backends import backend_for_device, device_type_of_graph
from .backends.rules import SchedulingRules

# Whether the steps simulated now are judged with the backward fxremat hands a C++ compile (reordered for fewer
# units): set around a partition by ``kernel_runs_joined``, read once by ``SimulatorInputs.now``.
_JOINS_KERNEL_RUNS = contextvars.ContextVar("fxremat_joins_kernel_runs", default=False)


@dataclass(frozen=True)
class SimulatorInputs:
    backend: SchedulingRules  # the rules of the Inductor backend that compiles the graphs
    buffer_reuse: str | None  # ``tp.ALLOCATED``, ``tp.ESTIMATED`` or None (dead buffers freed at once)
    reorders_for_peak: bool  # Inductor's ``reorder_for_peak_memory`` applies to each graph
    joins_kernel_runs: bool = False  # the backward is judged in the order ``rewrite/cpp_units.py`` hands over

    @classmethod
    def now(cls, device_type: str) -> SimulatorInputs:
        """The inputs Inductor's config in force implies for a graph on ``device_type``, with fxremat's buffer reuse
        (the compile's, where fxremat's backend is compiling)."""
        return cls(
            backend=backend_for_device(device_type),
            buffer_reuse=tp.inductor_buffer_reuse(),
            reorders_for_peak=tp.inductor_reorders_for_peak_memory(),
            joins_kernel_runs=_JOINS_KERNEL_RUNS.get(),
        )

    def stock(self) -> SimulatorInputs:
        """The same graphs as stock Inductor compiles them (PyTorch's split: its buffer reuse, no reordered units)."""
        return replace(self, buffer_reuse=tp.stock_buffer_reuse(), joins_kernel_runs=False)


def inputs_for(gm: fx.GraphModule, inputs: SimulatorInputs | None) -> SimulatorInputs:
    """``inputs``, or where a caller named none, those Inductor's config in force implies for ``gm``."""
    return inputs if inputs is not None else SimulatorInputs.now(device_type_of_graph(gm))


@contextlib.contextmanager
def kernel_runs_joined(joined: bool = True):
    """Within it (where ``joined``), a simulation that is given no inputs judges every backward in the order
    ``rewrite/cpp_units.py`` will hand Inductor (``SimulatorInputs.joins_kernel_runs``)."""
    token = _JOINS_KERNEL_RUNS.set(joined)
    try:
        yield
    finally:
        _JOINS_KERNEL_RUNS.reset(token)
