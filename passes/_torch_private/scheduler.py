"""Inductor's scheduler, patched for fxremat's compiles alone: each hook is installed once, process-wide, and acts
only where its caller's ``applies()`` is true (``fxremat.backend``: Inductor is compiling a graph fxremat cut, its
partitioner in Inductor's config, which also keys the FX graph cache).  Every other compile runs Inductor as is.
The version keys these read live in ``__init__.py``; tests: tests/passes/test_torch_versions.py."""

from __future__ import annotations

import logging
import threading

from torch._inductor.choices import InductorChoices
from torch._inductor.scheduler import SchedulerNode
from torch._inductor.virtualized import V

from .versions import SCHEDULER_DROPS_MUTATION_RENAMES

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_unfixed_recompute = None
_unvetoed_can_fuse = None


def inductor_keeps_mutation_order(applies) -> None:
    """Inductor's C++ scheduler must not run a reader of a mutated buffer before the mutation, in the compiles for
    which ``applies()`` is true (fxremat's).  Installed once, on torch 2.13: ``recompute_size_and_body`` drops a
    node's mutation renames; the wrapper re-applies them, as ``refresh_dependencies`` does.  docs/DESIGN.md §7."""
    global _unfixed_recompute
    with _LOCK:
        if _unfixed_recompute is not None or not SCHEDULER_DROPS_MUTATION_RENAMES:
            return
        unfixed = SchedulerNode.recompute_size_and_body

        def recompute_keeping_mutation_renames(self, *args, **kwargs):
            unfixed(self, *args, **kwargs)
            if self.mutation_renames and applies():
                # what ``refresh_dependencies`` does after re-reading a body
                self.set_read_writes(self.read_writes.rename(self.mutation_renames))

        _unfixed_recompute = unfixed
        SchedulerNode.recompute_size_and_body = recompute_keeping_mutation_renames


def inductor_vetoes_dragging_fusions(applies) -> None:
    """In the compiles for which ``applies()`` is true, Inductor refuses a vertical fusion that would drag much later
    work ahead of its place (``fusion.drags_too_much``, the simulator's rule too).  A fused node runs at its earliest
    member's place and ``Scheduler.topological_sort_schedule`` runs its dependencies first: fusing a parameter's
    gradient sum of one traversal of a block with the other traversal's (a block run twice) runs the whole backward
    in between at the first sum.  Installed once (``InductorChoices.can_fuse``: every fusion, vertical or
    horizontal, asks it last); docs/DESIGN.md §6."""
    global _unvetoed_can_fuse
    with _LOCK:
        if _unvetoed_can_fuse is not None:
            return
        unvetoed = InductorChoices.can_fuse

        def can_fuse_without_dragging(scheduler, node1, node2, shared_data_score):
            if not unvetoed(scheduler, node1, node2, shared_data_score):
                return False
            return not (applies() and _drags_too_much(scheduler, node1, node2))

        _unvetoed_can_fuse = unvetoed
        InductorChoices.can_fuse = staticmethod(can_fuse_without_dragging)


def dragged_nodes(scheduler, node1, node2, horizontal: bool = False) -> list:
    """The scheduler nodes that fusing ``node1`` and ``node2`` would move ahead of the fused node: the later one's
    ancestors that the earlier one does not already have and that Inductor placed after the earlier one.  Where the
    later one does not depend on the earlier (a horizontal fusion), none unless ``horizontal``: Inductor keeps those
    within 64 nodes (``are_long_distant_nodes``), and refusing them everywhere raises the peak where layers share a
    small read (RoPE tables; docs/DESIGN.md §6); fxremat's compiles refuse them in a backward recomputed segment by
    segment alone."""
    early, late = sorted((node1, node2), key=lambda n: n.min_order)
    gap = range(early.min_order + 1, late.min_order)
    if not gap or not (horizontal or early.get_operation_names() & late.ancestors):
        return []
    own = early.get_operation_names() | late.get_operation_names()
    # the nodes placed in between, or the later node's ancestors, whichever is fewer (a node's ancestors are all
    # of the graph before it: scanning them for every candidate pair would be quadratic in a long graph)
    names = _names_placed(scheduler, gap) if len(gap) < len(late.ancestors) else late.ancestors
    dragged: dict[str, object] = {}
    for name in names:
        if name in own or name not in late.ancestors or name in early.ancestors:
            continue
        node = scheduler.name_to_fused_node.get(name)
        if node is not None and node.min_order > early.min_order:
            dragged[node.get_name()] = node
    return list(dragged.values())


def _names_placed(scheduler, places: range) -> list[str]:
    """The names of the scheduler's original nodes at these places (``min_order``), kept on the scheduler."""
    by_place = getattr(scheduler, "_fxremat_names_by_place", None)
    if by_place is None:
        by_place = {}
        for fused in {id(n): n for n in scheduler.name_to_fused_node.values()}.values():
            for node in fused.get_nodes():
                by_place.setdefault(getattr(node, "min_order", None), []).append(node.get_name())
        scheduler._fxremat_names_by_place = by_place
    return [name for place in places for name in by_place.get(place, ())]


def _drags_too_much(scheduler, node1, node2) -> bool:
    # the simulator's rule (a module-level import would be circular)
    from ..simulator.fusion import drags_too_much
    from ..simulator.phase_graph import is_segmented_backward

    try:
        vertical = bool(node1.get_operation_names() & node2.ancestors or node2.get_operation_names() & node1.ancestors)
        segmented = not vertical and is_segmented_backward(getattr(V.graph, "module", None))
        dragged = dragged_nodes(scheduler, node1, node2, horizontal=segmented)
        if not dragged:
            return False
        saved, moved = scheduler.score_fusion_memory(node1, node2), 0
        for node in dragged:  # stop as soon as it is too much: the bytes are most of the veto's cost
            moved += _written_bytes(scheduler, node)
            if drags_too_much(moved, saved, vertical=vertical):
                return True
        return False
    except Exception as error:  # never fail a compile over a heuristic: Inductor's own decision stands
        log.debug("fusion veto skipped for %s, %s: %s", node1.get_name(), node2.get_name(), error, exc_info=True)
        return False


def _written_bytes(scheduler, node) -> int:
    """The bytes a scheduler node writes, kept on the scheduler by node name (a node is dragged by many pairs)."""
    known = getattr(scheduler, "_fxremat_written_bytes", None)
    if known is None:
        known = scheduler._fxremat_written_bytes = {}
    name = node.get_name()
    if name not in known:
        known[name] = sum(scheduler.dep_size_hint(w) for w in node.read_writes.writes)
    return known[name]
