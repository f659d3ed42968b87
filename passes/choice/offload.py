"""Offload under ``peak_budget`` (docs/DESIGN.md §16): which saved storages of a plan's split may go to host memory
(``offload_units``), which do (``choose_offloads``: the least exposed time first, until the simulated peak fits),
and the fastest (plan, offloads) pair that fits among the plans ``peak_budget`` simulated (``offloaded_choice``).

The schedule's arithmetic is ``simulator/transfer.py``'s; this module reads a split's graphs and timeline into it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.fx as fx

from .._torch_private import offload as tp_offload
from ..graph.costs import DeviceProfile, alias_root, node_cost
from ..graph.graph_facts import readers_through_views
from ..simulator.inputs import inputs_for
from ..simulator.liveness import PeakEstimate
from ..simulator.phase_graph import storage_bytes
from ..simulator.transfer import OffloadPlacement, OffloadUnit, Schedule, place

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


def schedule_of(fw: fx.GraphModule, bw: fx.GraphModule, peak: PeakEstimate, profile: DeviceProfile):
    """(the step's ``Schedule``, the forward's and the backward's point index by node name).  A node that is not a
    point of the timeline (fused into another kernel, a view) takes the next point in its graph's order."""
    phases = [phase for phase, _, _ in peak.timeline]
    forward_points = phases.count("forward")
    first_backward = next((i for i, phase in enumerate(phases) if phase == "backward"), len(phases))
    graphs = {"forward": fw, "backward": bw}
    nodes = {phase: {n.name: n for n in gm.graph.nodes} for phase, gm in graphs.items()}
    seconds = []
    for phase, name, _ in peak.timeline:
        node = nodes.get(phase, {}).get(name)
        seconds.append(
            node_cost(node, profile).recompute_seconds if node is not None and node.op == "call_function" else 0.0
        )
    held = tuple(total for _, _, total in peak.timeline)
    schedule = Schedule(held, tuple(seconds), forward_points, max(first_backward, forward_points))
    index = {phase: _point_index(gm, peak.timeline, phase) for phase, gm in graphs.items()}
    return schedule, index["forward"], index["backward"]


def _point_index(gm: fx.GraphModule, timeline, phase: str) -> dict[str, int]:
    points = {name: i for i, (p, name, _) in enumerate(timeline) if p == phase}
    last = max(points.values(), default=0)
    index, following = {}, last
    for node in reversed(list(gm.graph.nodes)):
        following = points.get(node.name, following)
        index[node.name] = following
    return index


def offload_units(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, indices, inputs) -> list[OffloadUnit]:
    """The storages of a split's saved values that may be offloaded (DESIGN §16): one per alias root that is
    computed in forward (not a graph input), held by no forward output the caller gets, of at least
    ``OFFLOAD_MIN_BYTES``, and saved as itself alone, as PyTorch's rewrite can offload it (``refusal``: saved views
    would need their base saved instead, not built); its last forward use over every alias, its first backward
    use over every saved value on it.  ``indices``: ``schedule_of``'s point indices."""
    forward_index, backward_index = indices
    outputs = fw.graph.output_node().args[0]
    caller_roots = {alias_root(n) for n in outputs[:num_fwd_outputs] if isinstance(n, fx.Node)}
    bw_inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    by_root: dict[fx.Node, list[fx.Node]] = {}
    for saved in outputs[num_fwd_outputs:]:
        if isinstance(saved, fx.Node) and isinstance(saved.meta.get("val"), torch.Tensor):
            by_root.setdefault(alias_root(saved), []).append(saved)
    units = []
    for root, saved in by_root.items():
        nbytes = storage_bytes(root, inputs.backend)
        if root.op != "call_function" or root in caller_roots or nbytes < OFFLOAD_MIN_BYTES:
            continue
        if saved != [root] or tp_offload.refusal(root) is not None:  # what PyTorch's rewrite can offload
            continue
        # every alias of the root is a view of it: its readers through views are the storage's
        readers = _kernel_readers(root)
        last = max((forward_index[u.name] for u in readers), default=forward_index[root.name])
        uses = _kernel_readers(bw_inputs[root.name]) if root.name in bw_inputs else []
        if not uses:
            continue
        units.append(OffloadUnit(root.name, nbytes, last, min(backward_index[u.name] for u in uses)))
    return units


def _kernel_readers(node: fx.Node) -> list[fx.Node]:
    """The nodes of its graph that read ``node``'s storage, through views (a view runs no kernel: the backward
    graph places them early, before the kernel that reads them), the graph's output apart."""
    return [u for u in readers_through_views(node) if u.op != "output"]


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
        best = _offloads_for(c, plan, (fw, bw), peak, inputs_for(fw, inputs), target, transfer) or best
    return best


def _offloads_for(c, plan, split, peak: PeakEstimate, inputs, target: int, transfer) -> Offloaded | None:
    """``plan`` (its split ``(fw, bw)`` simulated as ``peak``) with the offloads that bring it within ``target``,
    or None where none do."""
    fw, bw = split
    schedule, forward_index, backward_index = schedule_of(fw, bw, peak, c.profile)
    units = offload_units(fw, bw, c.request.num_fwd_outputs, (forward_index, backward_index), inputs)
    units = [
        u
        for u in units
        if u.last_forward_use < schedule.forward_points and u.first_backward_use >= schedule.first_backward
    ]
    found = choose_offloads(schedule, units, transfer, target)
    if found is None:
        return None
    chosen, placement = found
    points = tuple(name for _, name, _ in peak.timeline)
    seconds = plan.seconds + placement.exposed_seconds
    return Offloaded(plan, chosen, placement, seconds, points, schedule.forward_points)
