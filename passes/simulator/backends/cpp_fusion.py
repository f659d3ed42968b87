"""Inductor's C++ backend's own refusals of fusions (``CppScheduling._why_fuse_nodes``, torch/_inductor/codegen/cpp.py)
that the simulator's common rules (``fusion.py``) would make: a reduction before a pointwise kernel beside it
(``CppFusionVetoes.reduction_first``), and loops whose sizes do not line up (``CppFusionVetoes.loops_differ``, with the
sizes of ``cpp_loops.py``).  docs/DESIGN.md §6."""

from __future__ import annotations

import torch.fx as fx

from ..rules import FusionVetoes
from .cpp_loops import NO_LOOP, loop_sizes


class CppFusionVetoes(FusionVetoes):
    """The two vetoes over one phase's fusion, with what they read of each group kept up to date as groups merge:
    ``reducing``, the groups the backend schedules as reductions; ``shape``, each group's loop sizes (None where not
    worked out)."""

    def __init__(self, reducing: set[fx.Node], shape: dict[fx.Node, tuple | None]) -> None:
        self.reducing, self.shape = reducing, shape

    @classmethod
    def of(cls, phase, fusible: list[fx.Node]) -> CppFusionVetoes:
        """The vetoes over ``fusible``, units of ``phase`` (a ``phase._Phase``)."""
        return cls({u for u in fusible if phase.is_reduction(u)}, {u: loop_sizes(phase, u) for u in fusible})

    def refuses(self, fusion, ga: fx.Node, gb: fx.Node) -> bool:
        return self.reduction_first(fusion, ga, gb) or self.loops_differ(fusion, ga, gb)

    def reduction_first(self, fusion, ga: fx.Node, gb: fx.Node) -> bool:
        """Inductor's C++ backend refuses a horizontal fusion (neither group reads the other) whose earlier group
        is a reduction and whose later one is not: ``CppScheduling._why_fuse_nodes(node1, node2)`` (the scheduler
        pairs nodes in order, ``Scheduler.get_possible_fusions``) accepts only equal (loop, reduction) sizes or an
        earlier pointwise node, and a fused node is a reduction where any member is (``FusedSchedulerNode``: its
        ``group`` is its reduction's).  E.g. Mixtral's backward: an expert's one-column input-gradient ``bmm``
        (lowered to a sum) and the weight gradient's ``index_put`` that reads the same output gradient run in
        different kernels, with the router's ``addmm`` between them."""
        if not self.reducing:
            return False
        early, late = (ga, gb) if fusion.lo[ga] <= fusion.lo[gb] else (gb, ga)
        vertical = gb in fusion.succ[ga] or ga in fusion.succ[gb]
        return not vertical and early in self.reducing and late not in self.reducing

    def loops_differ(self, fusion, ga: fx.Node, gb: fx.Node) -> bool:
        """A pointwise loop whose sizes are not a reduction's loop and reduction sizes side by side: Inductor's C++
        backend fuses them neither way (``cpp_loops.py``); nor a ``ConcatKernel`` with a kernel that reads it
        (``NO_LOOP``)."""
        a, b = self.shape.get(ga), self.shape.get(gb)
        if NO_LOOP in (a, b):
            return (a is NO_LOOP and gb in fusion.succ[ga]) or (b is NO_LOOP and ga in fusion.succ[gb])
        if a is None or b is None or bool(a[1]) == bool(b[1]):
            return False
        pointwise, reduction = (a, b) if not a[1] else (b, a)
        return pointwise[0] != reduction[0] + reduction[1]

    def merged(self, ga: fx.Node, gb: fx.Node) -> None:
        if gb in self.reducing:
            self.reducing.add(ga)
        self.shape[ga] = _fused_sizes(self.shape.get(ga), self.shape.pop(gb, None))


def _fused_sizes(a: tuple | None, b: tuple | None) -> tuple | None:
    """A fused node's sizes: its reduction's, else those of its node with more dims, to which a one-dim node is
    re-indexed (``FusedSchedulerNode``, ``CppScheduling._can_fuse_nodes_with_compatible_ranges``); None where either
    is not known."""
    if NO_LOOP in (a, b):
        return NO_LOOP  # its readers still wait for the whole of it
    if a is None or b is None:
        return None
    if a[1] or b[1]:
        return a if a[1] else b
    return a if len(a[0]) >= len(b[0]) else b
