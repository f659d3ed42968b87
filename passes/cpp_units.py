"""Fewer C++ compilation units for Inductor's CPU backend, at no cost in memory.

Inductor's CPU backend emits the generated kernels that run between two extern kernels (matmuls, attention,
fallbacks) as one kernel group: one C++ source, so one g++ process on a cold compile and one module loaded on a warm
one (``Scheduler.codegen`` flushes the backend's ``KernelGroup`` before each extern kernel; ``walk.Walk.grouped``
models the group for memory).  A recomputed value read by an extern weight-gradient matmul puts that matmul between
kernels that need not be apart: Inductor fuses the recompute into a later kernel, which runs at the recompute's place
(``fusion.fusion_order``), and a kernel after the matmul that reads neither becomes a C++ unit of its own
(benchmarks/RESULTS.md, session 25: one extra unit at each of Llama's four RMSNorms, from recomputes that keep
1.25 MiB fewer bytes).

``join_kernel_runs`` moves such externs in the built backward graph: where the simulated schedule runs generated
kernels, then externs, then generated kernels that read none of those externs, the externs move after the second run,
so that both runs are one unit.  The new order is kept only where the simulated runs are fewer and the simulated
step peak is *the same*: never higher (memory first: issue #16 forbids buying a unit back with peak), and not lower
either, because the plan was chosen by its simulated peak under the order before, against the other settings' plans
(``memory_budget``'s peaks monotone, ``peak_budget=0.0`` the lowest: issue #15), and a reorder that lowered one plan's
peak and not another's would void those comparisons.  Reorders that lower the peak (GPT-2's default plan -6.1%,
block_sdpa's -9.9% measured: benchmarks/RESULTS.md, session 26) wait for the planner's estimates to include them.
Otherwise the graph is put back as it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.fx as fx

from . import _torch_private as tp
from .liveness import PeakEstimate, backward_simulations
from .lowering import KERNEL_CLASSES
from .ops import has_tag

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """What ``join_kernel_runs`` did: the moves made, the simulated runs of generated kernels before and after, and
    the simulation of the graph as it is left (its new order where kept, else its own); zeros and None where the
    graph was too large to try (``SIMULATED_NODES``)."""

    moves: int
    runs_before: int
    runs_after: int
    estimate: PeakEstimate | None


@dataclass(frozen=True)
class _Move:
    externs: tuple[fx.Node, ...]  # the nodes of extern kernels between two runs, in schedule order
    run: frozenset[fx.Node]  # the nodes of the run after them
    after: fx.Node  # the run's last node in graph order: the externs go right after it


def _generated(phase, unit: fx.Node) -> bool:
    """Whether ``unit`` is a generated CPU kernel, part of a kernel group (``walk.Walk.grouped``'s rule), rather
    than an extern one."""
    return phase.classes[unit] in KERNEL_CLASSES and phase.facts.on_cpu(unit)


def _schedule(phase) -> tuple[list[fx.Node], list[bool]]:
    """The backward's kernels in Inductor's order after fusion (heads), and whether each is generated."""
    order = phase.fusion_order()
    return order, [_generated(phase, head) for head in order]


def count_runs(generated: list[bool]) -> int:
    """Runs of generated kernels between extern ones: the C++ units a graph compiles to (before deduplication)."""
    return sum(1 for k, g in enumerate(generated) if g and (k == 0 or not generated[k - 1]))


def _nodes_of(phase, heads) -> list[fx.Node]:
    return [m for head in heads for unit in phase.kernels[head] for m in phase.members[unit]]


def _candidate_moves(phase, position: dict[fx.Node, int]) -> list[_Move]:
    """Each stretch run A, externs, run B of the schedule (A and B runs of generated kernels)."""
    order, generated = _schedule(phase)
    moves, k = [], 1
    while k < len(order):
        if generated[k] or not generated[k - 1]:
            k += 1
            continue
        first_run = k
        while first_run < len(order) and not generated[first_run]:
            first_run += 1
        end = first_run
        while end < len(order) and generated[end]:
            end += 1
        if first_run == len(order):
            break
        run = frozenset(_nodes_of(phase, order[first_run:end]))
        after = max(run, key=position.__getitem__)
        moves.append(_Move(tuple(_nodes_of(phase, order[k:first_run])), run, after))
        k = end
    return moves


def _users_up_to(node: fx.Node, last: int, position: dict[fx.Node, int]) -> list[fx.Node]:
    """``node``'s direct and indirect users placed at or before position ``last``."""
    found, stack, seen = [], [node], {node}
    while stack:
        for user in stack.pop().users:
            if user not in seen and user.op != "output" and position[user] <= last:
                seen.add(user)
                found.append(user)
                stack.append(user)
    return found


def _draws(node: fx.Node) -> bool:
    """Whether ``node`` may draw random numbers (attention with its dropout among them, whatever its probability)."""
    return has_tag(
        node, torch.Tag.nondeterministic_seeded
    )  # not ``op_class``'s RANDOM: that spares SDPA without dropout


def _writes(node: fx.Node) -> bool:
    """Whether ``node``'s place may matter to its neighbours though it reads none of them: a write into a tensor (a
    read moved past it would see the write, or no longer see it), or another side effect (an assert)."""
    if node.op != "call_function" or tp.is_mutation_op(node):
        return True
    return node.is_impure() and not _draws(node)  # a draw is impure to FX: it must not be dropped, it may be passed


def _movable(node: fx.Node) -> bool:
    """Neither a write nor a draw: the draws' order is the generator's state."""
    return not _writes(node) and not _draws(node)


class _LaterFusions:
    """Whether a generated kernel placed after some point may fuse with one passed by a move in a kernel that would
    not run before the moved externs anyway.  Inductor runs a fused kernel at its earliest member's place,
    dependencies first (``fusion.fusion_order``), so a node placed after a kernel that fuses with a later one runs
    after all of them: block_sdpa's bias-gradient sum, passed by the GELU weight gradient, fused with a norm's
    backward five externs later (a shared read of the output gradient, which the simulator's fusion did not see)
    and took that matmul and its 1 MiB input to the end of the graph (+5.6% measured).  A later kernel already fused
    (in the simulation) with one that runs before the externs is no such risk: it runs before them already (Llama's
    norm backward, whose recompute comes first)."""

    def __init__(self, phase) -> None:
        self.phase = phase
        self.generated = {u for u in phase.units if _generated(phase, u)}
        self.group = {u: units for units in phase.kernels.values() for u in units}

    def across(self, passed: list[fx.Node], later: list[fx.Node], position: dict[fx.Node, int], start: int) -> bool:
        """Whether a kernel of ``passed`` shares a read with one of ``later`` whose fused kernel starts after
        position ``start`` (the first moved extern's)."""
        unit, reads, members = self.phase.unit, self.phase.unit_reads, self.phase.members
        before = {unit.get(n) for n in passed} & self.generated
        if not before:
            return False
        read_before = set().union(*(reads[u] for u in before))
        for u in {unit.get(n) for n in later} & self.generated - before:
            if not read_before.isdisjoint(reads[u]):
                if min(position[m] for v in self.group[u] for m in members[v]) > start:
                    return True
        return False


def _apply(graph: fx.Graph, moves: list[_Move], later_fusions: _LaterFusions | None = None) -> int:
    """Move each move's externs (with their users up to the run's last node: getitems, views, later kernels) after
    the run, keeping their order; a move where the run reads one of them, a moved node is not ``_movable``, a
    node passed over ``_writes``, or a kernel passed over may fuse with a later one (``_LaterFusions``), is left
    out.  Returns the moves made."""
    made = 0
    for move in moves:
        nodes = list(graph.nodes)
        position = {n: i for i, n in enumerate(nodes)}
        last, moving = position[move.after], set()
        for extern in move.externs:
            if position[extern] > last:
                continue
            users = _users_up_to(extern, last, position)
            if move.run.intersection(users):
                moving = set()
                break
            moving.update([extern, *users])
        passed = nodes[min(map(position.__getitem__, moving), default=last) : last + 1]
        if not all(map(_movable, moving)) or any(map(_writes, passed)):
            moving = set()
        elif moving and later_fusions is not None:
            if later_fusions.across(passed, nodes[last + 1 :], position, position[passed[0]]):
                moving = set()
        anchor = move.after
        for node in sorted(moving, key=position.__getitem__):
            anchor.append(node)
            anchor = node
        made += bool(moving)
    return made


def _restore(graph: fx.Graph, original: list[fx.Node]) -> None:
    for before, node in zip(original, original[1:]):
        before.append(node)


# What the two simulations may cost, in graph nodes simulated (the first simulates forward and backward, the trial
# the backward again; about 0.06 ms a node here).  A graph beyond it is left as it is: a deep model's repeated blocks
# compile to the same few sources whatever their number (the 48-block stack of benchmarks/solve_time.py: 2.5-2.9 s
# of trials for 6 of 289 runs before this bound, with single moves tried).  Single moves are not tried either: on
# ViT and GPT-2 they cost 0.1-0.26 s of partition for no fewer distinct C++ sources (benchmarks/RESULTS.md, session
# 26), where all moves at once cost 10-60 ms.
SIMULATED_NODES = 4000


def join_kernel_runs(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> Joined:
    """Reorder ``bw`` in place (recompiled where changed) for fewer C++ units where its simulated step peak stays
    the same (module docstring): every move at once, kept where the simulation says so, else the graph put back;
    nothing tried on a graph beyond ``SIMULATED_NODES``."""
    if len(fw.graph.nodes) + 2 * len(bw.graph.nodes) > SIMULATED_NODES:
        return Joined(0, 0, 0, None)
    simulate = backward_simulations(fw, num_fwd_outputs)
    estimate, phase = simulate(bw)
    runs = count_runs(_schedule(phase)[1])
    original = list(bw.graph.nodes)
    made = _apply(bw.graph, _candidate_moves(phase, {n: i for i, n in enumerate(original)}), _LaterFusions(phase))
    if not made:
        return Joined(0, runs, runs, estimate)
    joined, joined_phase = simulate(bw)
    joined_runs = count_runs(_schedule(joined_phase)[1])
    if joined_runs < runs and joined.peak_bytes == estimate.peak_bytes:
        bw.recompile()
        log.debug("joined kernel runs: %d moves, %d -> %d runs", made, runs, joined_runs)
        return Joined(made, runs, joined_runs, joined)
    _restore(bw.graph, original)
    return Joined(0, runs, runs, estimate)
