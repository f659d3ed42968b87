"""Offload under ``peak_budget`` (docs/DESIGN.md §16): which saved storages of a plan's split may go to host memory
(``offload_units``), which do (``choose_offloads``: the least exposed time first, until the simulated peak fits),
and the fastest (plan, offloads) pair that fits among the plans ``peak_budget`` simulated (``offloaded_choice``).

The schedule's arithmetic is ``simulator/transfer.py``'s; this module reads a split's graphs and timeline into it.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
import torch.fx as fx

from .._torch_private import offload as tp_offload
from ..graph.costs import DeviceProfile, alias_root, node_cost
from ..simulator.inputs import inputs_for
from ..simulator.liveness import PeakEstimate, simulate_step
from ..simulator.phase_graph import storage_bytes
from ..simulator.transfer import OffloadPlacement, OffloadUnit, Schedule, place

log = logging.getLogger(__name__)

# A storage below this is never offloaded: a small copy does not reach the link's bandwidth, and its fixed cost is
# not modelled (DESIGN §16).
OFFLOAD_MIN_BYTES = 1 << 20
# The most plans whose split is built to try offloads on, fastest first (each costs a split and its placements).
OFFLOAD_PLANS_TRIED = 24


@dataclass(frozen=True)
class Offloaded:
    """A plan with offloads: the storages (``units``, by their root's name), their placement on the schedule, and
    the plan's estimated seconds with the copies' exposed seconds added."""

    plan: object
    units: tuple[OffloadUnit, ...]
    placement: OffloadPlacement
    seconds: float
    points: tuple[str, ...] = ()  # the schedule's points, by node name
    forward_points: int = 0

    def rows(self) -> list[tuple[str, int, float, str, str]]:
        """The report's rows: each offloaded storage, its bytes, the stalls it causes, the forward node its
        offload's wait goes before ("": the forward's end) and the backward node its reload is issued before."""
        placed = zip(self.units, self.placement.stalls, self.placement.waits, self.placement.reloads)
        return [
            (
                unit.name,
                unit.nbytes,
                stall,
                self.points[wait] if wait < self.forward_points else "",
                self.points[reload],
            )
            for unit, stall, wait, reload in placed
        ]


def schedule_of(fw: fx.GraphModule, bw: fx.GraphModule, peak: PeakEstimate, profile: DeviceProfile) -> Schedule:
    """The step's ``Schedule`` from ``peak`` (the split's simulation with its nodes' points, ``PeakEstimate.points``):
    each point's compute seconds, and its node's place in its own graph (``Schedule.positions``)."""
    phases = [phase for phase, _, _ in peak.timeline]
    forward_points = phases.count("forward")
    first_backward = next((i for i, phase in enumerate(phases) if phase == "backward"), len(phases))
    graphs = {"forward": fw, "backward": bw}
    nodes = {phase: {n.name: (i, n) for i, n in enumerate(gm.graph.nodes)} for phase, gm in graphs.items()}
    seconds, positions = [], []
    for phase, name, _ in peak.timeline:
        position, node = nodes.get(phase, {}).get(name, (-1, None))
        seconds.append(
            node_cost(node, profile).recompute_seconds if node is not None and node.op == "call_function" else 0.0
        )
        positions.append(position)
    held = tuple(total for _, _, total in peak.timeline)
    return Schedule(held, tuple(seconds), forward_points, max(first_backward, forward_points), tuple(positions))


def offload_units(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, points, inputs) -> list[OffloadUnit]:
    """The storages of a split's saved values that may be offloaded (DESIGN §16): one per alias root that is
    computed in forward (not a graph input), held by no forward output the caller gets, of at least
    ``OFFLOAD_MIN_BYTES``, and saved as itself alone, as PyTorch's rewrite can offload it (``refusal``: saved views
    would need their base saved instead, not built); its last forward use, the last point of a kernel reading any
    alias, its first backward use the first point of a kernel reading it (``points``: the split's ``StepPoints``);
    the graph places PyTorch's rewrite puts its offload after and its reload's wait before."""
    outputs = fw.graph.output_node().args[0]
    caller_roots = {alias_root(n) for n in outputs[:num_fwd_outputs] if isinstance(n, fx.Node)}
    bw_inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    by_root: dict[fx.Node, list[fx.Node]] = {}
    for saved in outputs[num_fwd_outputs:]:
        if isinstance(saved, fx.Node) and isinstance(saved.meta.get("val"), torch.Tensor):
            by_root.setdefault(alias_root(saved), []).append(saved)
    fw_position = {n: i for i, n in enumerate(fw.graph.nodes)}
    bw_position = {n: i for i, n in enumerate(bw.graph.nodes)}
    units = []
    for root, saved in by_root.items():
        nbytes = storage_bytes(root, inputs.backend)
        if root.op != "call_function" or root in caller_roots or nbytes < OFFLOAD_MIN_BYTES:
            continue
        if saved != [root] or tp_offload.refusal(root) is not None:  # what PyTorch's rewrite can offload
            continue
        # a reader's points are those of the kernels that run it, a view's those of the kernels reading it
        ends = [span[1] for span in _spans(root, points.forward)]
        last = max(ends, default=points.forward[root.name][1] if root.name in points.forward else -1)
        placeholder = bw_inputs.get(root.name)
        starts = [span[0] for span in _spans(placeholder, points.backward)] if placeholder is not None else []
        if last < 0 or not starts:
            continue
        after, by = tp_offload.offload_follows(root), tp_offload.reload_precedes(placeholder)
        unit = OffloadUnit(root.name, nbytes, last, min(starts), fw_position[after], bw_position[by])
        units.append(unit)
    return units


def _spans(node: fx.Node, points: dict[str, tuple[int, int]]) -> list[tuple[int, int]]:
    """The points of the kernels that read ``node`` (``StepPoints``), each as (first, last)."""
    return [points[u.name] for u in node.users if u.op != "output" and u.name in points]


def choose_offloads(schedule: Schedule, units: list[OffloadUnit], transfer, target: int):
    """The offloads that bring ``schedule``'s peak within ``target``, or None where none do: candidates in order of
    the exposed seconds each causes alone (then the larger first); each one live at the current peak point is
    offloaded where it lowers the peak, until the peak fits."""
    alone = {unit: place(schedule, [unit], transfer).exposed_seconds for unit in units}
    order = sorted(units, key=lambda u: (alone[u], -u.nbytes, u.name))
    chosen: list[OffloadUnit] = []
    placement = place(schedule, chosen, transfer)
    while placement.peak_bytes > target:
        point = placement.bytes_held.index(placement.peak_bytes)
        for unit in order:
            if unit in chosen or not unit.last_forward_use < point < unit.first_backward_use:
                continue
            trial = place(schedule, [*chosen, unit], transfer)
            if trial.bytes_held[point] < placement.bytes_held[point]:
                chosen, placement = [*chosen, unit], trial
                break
        else:
            return None
    return tuple(chosen), placement


def offloaded_choice(c, candidates, target: int, fastest_seconds: float, simulated) -> Offloaded | None:
    """The fastest of ``candidates`` (every plan ``peak_budget`` ranked, not only those it simulated: a plan over
    the budget may fit with offloads) that fits ``target`` with offloads, where it is faster than
    ``fastest_seconds`` (the fastest plan that fits without them, or infinity), else None; at most
    ``OFFLOAD_PLANS_TRIED`` plans are tried, fastest first."""
    inputs = simulated.inputs
    backend, link = inputs_for(c.joint, inputs).backend, c.profile.host_link_bandwidth
    if backend.transfer_seconds(1, link) is None:
        warnings.warn(
            f"fxremat: offload={c.settings.offload!r} offloads nothing on {c.request.graph_id}: the device profile "
            f"{c.profile.name!r} has no host link, or its Inductor backend no offload (docs/DESIGN.md §16)",
            stacklevel=4,
        )
        return None

    def transfer(nbytes: int) -> float:
        return backend.transfer_seconds(nbytes, link)

    best, tried = None, 0
    for plan in sorted(candidates, key=lambda p: p.seconds):
        if plan.seconds >= min(fastest_seconds, best.seconds if best else float("inf")) or tried >= OFFLOAD_PLANS_TRIED:
            break
        peak = simulated.simulation(plan)
        if peak is None or peak.peak_bytes <= target:
            continue
        tried += 1
        fw, bw = simulated.split_of(plan)[:2]
        try:  # the split's own simulation, with where each node runs on its timeline
            peak = simulate_step(fw, bw, c.request.num_fwd_outputs, inputs=inputs, points=True)
        except Exception as error:  # as ``JudgedPlans`` drops a candidate it cannot simulate
            log.debug("simulation of a candidate plan's split failed: %s", error, exc_info=True)
            continue
        best = _offloads_for(c, plan, (fw, bw), peak, inputs_for(fw, inputs), target, transfer) or best
    return best


def _offloads_for(c, plan, split, peak: PeakEstimate, inputs, target: int, transfer) -> Offloaded | None:
    """``plan`` (its split ``(fw, bw)`` simulated as ``peak``, with its nodes' points) with the offloads that bring
    it within ``target``, or None where none do."""
    fw, bw = split
    schedule = schedule_of(fw, bw, peak, c.profile)
    units = offload_units(fw, bw, c.request.num_fwd_outputs, peak.points, inputs)
    units = [
        u
        for u in units
        if u.last_forward_use < schedule.forward_points
        and u.first_backward_use >= schedule.first_backward
        and u.reload_points(schedule)  # a reload both orders can place (DESIGN §16)
    ]
    found = choose_offloads(schedule, units, transfer, target)
    if found is None:
        return None
    chosen, placement = found
    points = tuple(name for _, name, _ in peak.timeline)
    seconds = plan.seconds + placement.exposed_seconds
    return Offloaded(plan, chosen, placement, seconds, points, schedule.forward_points)
