"""What a compile hands the partition beyond its graph: the device the joint graph runs on, and the simulator's inputs
read from the compile's config once per partition (``passes/simulator/inputs.py``; docs/DESIGN.md §6.0)."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.simulator.backends import backend_for_device
from fxremat_passes.simulator.inputs import SimulatorInputs


def simulator_inputs(request, stock: bool = False, caller_bytes: int | None = None) -> SimulatorInputs:
    """What the simulation of a compile's splits assumes (``passes/simulator/inputs.py``), read once from the compile
    (``request``: its ``partition.PartitionRequest``): the backend Inductor generates code with for the graph's
    device, the compile's buffer reuse (``stock``: the one stock Inductor would use, for PyTorch's split), whether
    Inductor reorders for peak memory and what its layout decision reads, under the config in force (a layout the
    partitioner chooses later changes these inputs, ``LayoutChoice.simulator_inputs``), whether fxremat hands the
    backward over reordered for fewer C++ units, and the user's figure for the caller's work between the graphs
    (``Options.caller_bytes``)."""
    backend = backend_for_device(graph_device(request.joint)[0] or "cpu")
    return SimulatorInputs(
        backend=backend,
        buffer_reuse=tp.stock_buffer_reuse() if stock else tp.inductor_buffer_reuse(),
        reorders_for_peak=tp.inductor_reorders_for_peak_memory(),
        estimate_counts_outputs=tp.inductor_estimate_counts_outputs(),
        layout_optimisation=bool(tp.inductor_config_value("layout_optimization")),
        forces_layout_optimisation=bool(tp.inductor_config_value("force_layout_optimization")),
        mkldnn_enabled=tp.mkldnn_enabled(),
        joins_kernel_runs=not stock and request.inductor and backend.joins_kernel_runs,
        caller_bytes=caller_bytes,
    )


def graph_device(joint: fx.GraphModule) -> tuple[str | None, str | None]:
    for node in joint.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "meta":
            if val.device.type == "cuda" and torch.cuda.is_available():
                return "cuda", torch.cuda.get_device_name(val.device)
            return val.device.type, None
    return None, None
