"""A recorded graph (``fxremat/recording.py``) partitioned and simulated again, on any machine: the joint rebuilt
from its record with fake tensors on its recorded device (a CUDA graph on a machine without a GPU), the config of
the recording machine restored, the partitioner that ran there run again with the recorded options, device profile
and simulator inputs; then the plan compared with the recorded one, and the simulated kernels with the kernels
Inductor emitted there (``compare_schedules``).  ``benchmarks/gpu_replay.py`` runs it over a recording's files and
sets the simulated peaks beside the measured ones (docs/DESIGN.md §15)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import recording as tp_recording
from fxremat_passes.graph.costs import PROFILES
from fxremat_passes.rewrite.describe import describe_split
from fxremat_passes.rewrite.layout_choice import LayoutChoice
from fxremat_passes.simulator.backends import backend_for_device, backend_rules, device_type_of_graph
from fxremat_passes.simulator.inputs import SimulatorInputs
from fxremat_passes.simulator.liveness import simulate_step, simulated_kernels

from . import graph_record
from .options import Options
from .partition import PartitionRequest, partition
from .recording import plan_of, profile_from_dict

# the scheduler nodes that emit no kernel (views, reinterpretations): left out of the comparison
NO_KERNEL = ("NopKernelSchedulerNode",)


def rebuild(joint_data: dict[str, Any]) -> fx.GraphModule:
    """The recorded joint graph, its values fake tensors on their recorded devices."""
    return graph_record.graph_from_dict(joint_data)


def simulator_from_dict(data: dict[str, Any]) -> SimulatorInputs:
    """The recorded ``SimulatorInputs``, its backend's rules those of the recording's torch release; a field the
    recording lacks (one added to ``SimulatorInputs`` after it was made) takes ``SimulatorInputs.default``'s."""
    recorded = {k: v for k, v in data.items() if k not in ("backend", "backend_torch")}
    rules = backend_rules(data["backend"], tuple(data["backend_torch"]))
    return SimulatorInputs.default("cpu").with_changes(**recorded, backend=rules)


def _joint_inputs(joint: fx.GraphModule) -> list:
    return [n.meta.get("val") for n in joint.graph.nodes if n.op == "placeholder"]


def _fxremat(entry: dict[str, Any], joint: fx.GraphModule):
    """(fw, bw, plan, simulated step peak, the simulator inputs) of fxremat's partition as recorded."""
    inputs = simulator_from_dict(entry["simulator"])
    options = Options.create(**entry["options"], device=profile_from_dict(entry["profile"]))
    request = PartitionRequest(
        joint=joint,
        joint_inputs=_joint_inputs(joint),
        num_fwd_outputs=entry["num_fwd_outputs"],
        static_lifetime_input_indices=entry["static_lifetime_input_indices"],
        graph_id=entry.get("graph_id", "replayed"),
        inductor=entry["inductor"],
        layout=LayoutChoice() if entry.get("layout_chosen") else None,
        simulator=inputs,
    )
    fw, bw, report = partition(request, options)
    plan = plan_of(report.saved, report.recomputed, report.saved_symbols)
    return fw, bw, plan, report.simulated_peak_bytes, inputs, report.fallback_reason


def _pytorch(entry: dict[str, Any], joint: fx.GraphModule):
    """(fw, bw, plan, simulated step peak, the simulator inputs) of PyTorch's partition as recorded, simulated as
    stock Inductor compiles it (its buffer reuse; saved inputs kept as its layout's copies)."""
    n = entry["num_fwd_outputs"]
    fw, bw = tp.pytorch_default_partition(
        joint,
        _joint_inputs(joint),
        num_fwd_outputs=n,
        static_lifetime_input_indices=entry["static_lifetime_input_indices"],
        activation_memory_budget=entry.get("memory_budget", 1.0),
    )
    described = describe_split(fw, bw, n, PROFILES["cpu"])
    backend = backend_for_device(device_type_of_graph(fw), tp.torch_version_tuple(entry["torch"]))
    inputs = SimulatorInputs(
        backend=backend,
        buffer_reuse=tp.stock_buffer_reuse(),
        reorders_for_peak=tp.inductor_reorders_for_peak_memory(),
        estimate_counts_outputs=tp.inductor_estimate_counts_outputs(),
        layout_optimisation=bool(tp.inductor_config_value("layout_optimization")),
        forces_layout_optimisation=bool(tp.inductor_config_value("force_layout_optimization")),
        mkldnn_enabled=tp.mkldnn_enabled(),
    )
    peak = simulate_step(fw, bw, n, recopy=False, inputs=inputs).peak_bytes
    return fw, bw, plan_of(described.saved, described.recomputed, described.saved_symbols), peak, inputs, None


def replay_graph(entry: dict[str, Any], joint_data: dict[str, Any]) -> dict[str, Any]:
    """One recorded graph partitioned and simulated again: whether the rebuilt joint writes down as recorded, the
    plan (and whether it is the recorded one), the simulated step peak, and the simulated kernels against the
    recorded schedules (``compare_schedules``)."""
    joint = rebuild(joint_data)
    rewritten = graph_record.graph_to_dict(joint)
    with tp_recording.config_restored(entry["config"]) as unknown_config:
        if entry["partitioner"] == "fxremat":
            fw, bw, plan, peak, inputs, fallback = _fxremat(entry, joint)
        else:
            fw, bw, plan, peak, inputs, fallback = _pytorch(entry, joint)
        kernels = simulated_kernels(fw, bw, entry["num_fwd_outputs"], inputs)
    recorded_plan = entry.get("plan")
    return dict(
        partitioner=entry["partitioner"],
        joint_nodes=len(rewritten["nodes"]),
        joint_as_recorded=rewritten["nodes"] == joint_data["nodes"],
        plan=plan,
        plan_as_recorded=plan == recorded_plan,
        plan_differences=plan_differences(plan, recorded_plan) if recorded_plan else None,
        fallback_reason=fallback,
        simulated_peak_bytes=peak,
        recorded_simulated_peak_bytes=(entry.get("report") or {}).get("simulated_peak_bytes"),
        schedules=compare_schedules(kernels, entry.get("schedules", [])),
        config_names_unknown_here=len(unknown_config),
        torch_recorded=entry["torch"],
        torch_here=torch.__version__,
    )


def plan_differences(plan: dict[str, list[str]], recorded: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """Per field of the plans, the names only the replay has and only the recording has."""
    out = {}
    for key in sorted(set(plan) | set(recorded)):
        mine, theirs = set(plan.get(key, ())), set(recorded.get(key, ()))
        if mine != theirs:
            out[key] = dict(replay_only=sorted(mine - theirs)[:20], recorded_only=sorted(theirs - mine)[:20])
    return out


def compare_schedules(simulated: dict[str, list[dict]], schedules: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase, the simulator's kernels against Inductor's recorded ones, each kernel as the values it stores
    (Inductor: its buffers' origin nodes; the simulator: its units), over the values both know."""
    out: dict[str, Any] = {}
    for phase in ("forward", "backward"):
        recorded = [s for s in schedules if s.get("backward") == (phase == "backward")]
        if not recorded:
            out[phase] = None
            continue
        stored = [
            frozenset(o[2] for o in k["outputs"] if o[2])
            for k in recorded[0]["kernels"]
            if k["kind"] not in NO_KERNEL
        ]
        out[phase] = _compare(stored, [frozenset(k["units"]) for k in simulated[phase]])
    return out


def _compare(recorded: list[frozenset], simulated: list[frozenset]) -> dict[str, Any]:
    recorded, simulated = [k for k in recorded if k], [k for k in simulated if k]
    rec_values, sim_values = frozenset().union(*recorded), frozenset().union(*simulated)
    common = rec_values & sim_values
    rec_common = [k & common for k in recorded if k & common]
    sim_common = [k & common for k in simulated if k & common]
    same = set(rec_common) & set(sim_common)
    sim_place = {v: i for i, k in enumerate(sim_common) for v in k}
    ordered = [min(sim_place[v] for v in k) for k in rec_common]
    in_order = sum(a <= b for a, b in zip(ordered, ordered[1:]))
    differing = [sorted(k) for k in rec_common if k not in same][:5]
    return dict(
        recorded_kernels=len(recorded),
        simulated_kernels=len(simulated),
        values_recorded_only=len(rec_values - sim_values),
        values_simulated_only=len(sim_values - rec_values),
        values_common=len(common),
        kernels_same=len(same),
        kernel_agreement=len(same) / len(rec_common) if rec_common else None,
        order_agreement=in_order / (len(ordered) - 1) if len(ordered) > 1 else None,
        first_differing_recorded=differing,
    )
