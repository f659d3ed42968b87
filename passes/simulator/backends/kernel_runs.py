"""The backward's order with fewer runs of generated kernels: what ``cpp_units.py`` hands Inductor's CPU backend, and
what the simulation of a plan's step assumes it will get (``SimulatorInputs.joins_kernel_runs``).

Inductor's CPU backend emits the generated kernels that run between two extern kernels (matmuls, attention,
fallbacks) as one kernel group: one C++ source, so one g++ process on a cold compile and one module loaded on a warm
one (``Scheduler.codegen`` flushes the backend's ``KernelGroup`` before each extern kernel; ``walk.Walk.grouped``
models the group for memory).  A recomputed value read by an extern weight-gradient matmul puts that matmul between
kernels that need not be apart: Inductor fuses the recompute into a later kernel, which runs at the recompute's place
(``fusion.fusion_order``), and a kernel after the matmul that reads neither becomes a C++ unit of its own (an
RMSNorm's backward, for instance; docs/DESIGN.md §8).

``joined_orders`` reads a backward's simulated schedule (its ``phase._Phase``) and, where it runs generated kernels,
then externs, then generated kernels, moves each of those externs that the second run does not read (directly or
through its users up to the run's last node) after the second run, with those users.  Where all of them move,
both runs are one unit.  Where the run reads some, those stay and the others may move anyway (a partial move,
tried as a second order): an extern run later allocates its output later, which can lower the step's peak (a
weight-gradient matmul moved past the embedding gradients).  It works on a
``PhaseGraph``'s node list, so that a plan's virtual backward (``plan_memory.estimate_peak``) and the built one
(``cpp_units.py``) get the same order.  Whether the order is kept is the simulation's call
(``liveness._ForwardRun.joined``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from ... import _torch_private as tp
from ...graph.ops import has_tag

# What a joined step may cost, in graph nodes simulated (forward once, backward twice; about 0.06 ms a node here). A
# larger graph keeps its order: a deep model's repeated blocks compile to the same few sources whatever their number,
# and the trials would cost more than the partition (docs/DESIGN.md §13: ``solve_time.py``'s 48 blocks).  The built
# split and the plan's virtual one count the same nodes (``phase_graph.py``).
SIMULATED_NODES = 4000


def too_large(forward_nodes: int, backward_nodes: int) -> bool:
    return forward_nodes + 2 * backward_nodes > SIMULATED_NODES


@dataclass(frozen=True)
class _Move:
    externs: tuple[fx.Node, ...]  # the nodes of extern kernels between two runs, in schedule order
    run: frozenset[fx.Node]  # the nodes of the run after them
    after: fx.Node  # the run's last node in graph order: the externs go right after it


def _generated(phase, unit: fx.Node) -> bool:
    """Whether ``unit`` is a generated kernel of a kernel group (``phase._Phase.in_kernel_group``), rather than an
    extern one."""
    return phase.in_kernel_group(unit)


def _schedule(phase) -> tuple[list[fx.Node], list[bool]]:
    """The backward's kernels in Inductor's order after fusion (heads), and whether each is generated."""
    order = phase.fusion_order()
    return order, [_generated(phase, head) for head in order]


def count_runs(generated: list[bool]) -> int:
    """Runs of generated kernels between extern ones: the C++ units a graph compiles to (before deduplication)."""
    return sum(1 for k, g in enumerate(generated) if g and (k == 0 or not generated[k - 1]))


def runs_of(phase) -> int:
    """The runs of generated kernels of a simulated phase (``count_runs``)."""
    return count_runs(_schedule(phase)[1])


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


def _users_up_to(view, node: fx.Node, last: int, position: dict[fx.Node, int]) -> list[fx.Node]:
    """``node``'s direct and indirect users in ``view`` placed at or before position ``last``."""
    found, stack, seen = [], [node], {node}
    while stack:
        for user in view.users(stack.pop()):
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
    if node.op != "call_function":
        return True
    if isinstance(node.target, torch._ops.OpOverload) and "out" not in node.kwargs:
        # then both rules read the operator alone (its schema, its tags, its registered effects): asked once per
        # operator, as ``node.is_impure`` is slow (160k calls reordering T5's backwards at memory_budget=0.0)
        known = _WRITES_BY_OPERATOR.get(node.target)
        if known is None:
            known = _WRITES_BY_OPERATOR[node.target] = _node_writes(node)
        return known
    return _node_writes(node)


_WRITES_BY_OPERATOR: dict = {}  # OpOverload -> whether its nodes write (``_writes``)


def _node_writes(node: fx.Node) -> bool:
    """``_writes`` of a call_function node, asked of the node itself (Inductor's mutation rule, FX's impurity)."""
    if tp.is_mutation_op(node):
        return True
    return node.is_impure() and not _draws(node)  # a draw is impure to FX: it must not be dropped, it may be passed


class _LaterFusions:
    """Whether a generated kernel placed after some point may fuse with one passed by a move in a kernel that would
    not run before the moved externs anyway.  Inductor runs a fused kernel at its earliest member's place,
    dependencies first (``fusion.fusion_order``), so a node placed after a kernel that fuses with a later one runs
    after all of them: block_sdpa's bias-gradient sum, passed by the GELU weight gradient, fused with a norm's
    backward five externs later (a shared read of the output gradient, which the simulator's fusion did not see)
    and took that matmul and its input to the end of the graph, raising the measured peak.  A later kernel already fused
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


class _OrderIndex:
    """An order's positions and its writing nodes (``_writes``: few, and the same in every order of one graph), so
    that ``_moving`` asks whether a stretch of the order writes without asking each node it passes: that asking
    (``node.is_impure`` is slow) was most of a raised budget's reordering.  Made again only where a move changes the
    order."""

    def __init__(self, order: list[fx.Node], writers: list[fx.Node] | None = None) -> None:
        self.writers = [n for n in order if _writes(n)] if writers is None else writers
        self.position = {n: i for i, n in enumerate(order)}

    def writes_between(self, first: int, last: int) -> bool:
        """Whether a node at a position from ``first`` to ``last`` (both included) writes."""
        return any(first <= self.position[n] <= last for n in self.writers)


def _moving(
    view,
    order: list[fx.Node],
    move: _Move,
    later_fusions: _LaterFusions | None,
    partial: bool,
    index: _OrderIndex | None = None,
) -> set[fx.Node]:
    """The nodes ``move`` carries after its run in ``order``: each of its externs with its users up to the run's
    last node (getitems, views, later kernels), unless the run reads one of those: then, where ``partial``, the
    extern stays (and so does every extern it reads: their users include it), else nothing moves; nothing either
    where a moved node is a write or a draw (the draws' order is the generator's state), a node passed over
    ``_writes``, or a kernel passed over may fuse with a later one (``_LaterFusions``).  ``index``: ``order``'s,
    where the caller keeps it."""
    index = index or _OrderIndex(order)
    position = index.position
    last, moving = position[move.after], set()
    for extern in move.externs:
        if position[extern] > last:
            continue
        users = _users_up_to(view, extern, last, position)
        if move.run.intersection(users):  # it stays, and so does every extern it reads
            if not partial:
                return set()
            continue
        moving.update([extern, *users])
    first = min(map(position.__getitem__, moving), default=last)
    passed = order[first : last + 1]
    if any(_writes(n) or _draws(n) for n in moving) or index.writes_between(first, last):
        return set()
    if moving and later_fusions is not None:
        if later_fusions.across(passed, order[last + 1 :], position, position[passed[0]]):
            return set()
    return moving


def reordered(view, moves: list[_Move], later_fusions: _LaterFusions | None = None, partial: bool = False):
    """``view``'s nodes with each move's nodes (``_moving``) right after its run's last node, in their order:
    (the new order, the moves made)."""
    order, made = list(view.nodes), 0
    index = _OrderIndex(order)
    for move in moves:
        moving = _moving(view, order, move, later_fusions, partial, index)
        if moving:
            last = index.position[move.after]
            carried = [n for n in order[: last + 1] if n in moving]
            order = [n for n in order[: last + 1] if n not in moving] + carried + order[last + 1 :]
            index = _OrderIndex(order, index.writers)
            made += 1
    return order, made


def joined_orders(view, phase) -> list[list[fx.Node]]:
    """``view``'s nodes with every move of its simulated schedule made (``phase``: the simulation of ``view``):
    with the partial moves, then without them where that differs; none where no move can be made.  Both are
    tried: a partial move can raise the peak where the whole moves alone keep it (a 2-block Llama's backward)."""
    moves, later = _candidate_moves(phase, {n: i for i, n in enumerate(view.nodes)}), _LaterFusions(phase)
    orders = []
    for partial in (True, False):
        order, made = reordered(view, moves, later, partial)
        if made and order not in orders:
            orders.append(order)
    return orders
