"""The sizes of a unit's loop as Inductor's C++ backend sees them, where they decide whether two kernels may fuse.

Inductor simplifies a kernel's loop before fusing (a ``SchedulerNode``'s ``group``: the sizes of its loop and of its
reduction after ``simplify_and_reorder`` merges each pair of neighbouring dims that every read and the write
allow, size-1 dims dropped).  A pointwise loop whose reads are all laid out as its output merges into one dim; one
that reads a LayerNorm's weight or its per-row statistics keeps (rows, cols); one that adds a position table
broadcast over the batch keeps (batch, rest).  A reduction over the last dim keeps (rows,) and (cols,).
``CppScheduling._why_fuse_nodes`` (torch/_inductor/codegen/cpp.py) fuses a pointwise loop with a reduction only
where the pointwise sizes are the reduction's loop and reduction sizes side by side ("COMPATIBLE_REDUCTION"), and
no outer-loop fusion joins them where their outer loops differ.  E.g. ViT's backward with its recomputed residual
stream moved ahead of the weight-gradient matmuls: ``add_10`` (the embeddings plus a position table, plus the
blocks' outputs) runs as (2, 31232) and the layer norm's backward sums that read it as (244,) + (256,), so Inductor
runs them as two kernels (its fusion log has no entry for the pair); fusing them in the simulation puts a layer's
recompute and its norm backward in one kernel, and the simulated peak below the measured one (docs/DESIGN.md §6).
A read whose dims do not line up with the loop's merges with no neighbour (``BLOCKED``); where a read goes through
a slice or a transpose (an access path, ``access.py``) the sizes are not worked out, and nothing is refused.
"""

from __future__ import annotations

import math

import torch.fx as fx

from ...graph.ops import OpClass
from ..access import reduced_dims, sizes_strides

# The loop sizes ``loop_sizes`` gives a ``ConcatKernel``: a NopKernel (``lowering.concat_kernel``), between the kernels
# that write its slices and those that read it (``Scheduler.can_fuse``: "node1 is nop", "node2 is extern or nop"), so
# a kernel that reads it never fuses with one that writes it (``cpp_fusion.CppFusionVetoes.loops_differ``).  ViT's
# class token and patch embeddings: fused with the first block's norm backward in the simulation, three kernels in
# Inductor's.
NO_LOOP = ("no loop",)
# A read's stride in a dim where it does not line up with the loop: it merges with no neighbour (``_merged``).  Its own
# object, so that it is never taken for ``_read_strides``' None (sizes not known) nor for a stride.
BLOCKED = "blocked"


def _contiguous(sizes: list) -> list:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return strides[::-1]


def _read_strides(storage: fx.Node, loop: list, numel: int) -> list | None:
    """The strides of a read of ``storage`` at the loop's own index, broadcast where its dims are 1 or missing;
    ``BLOCKED`` in each dim where its dims do not line up with the loop's (a ``select_scatter`` of a row into a
    zero tensor: Inductor's index there also reads the selected dim's own index, and no dims merge); None where the
    storage's sizes are not known."""
    found = sizes_strides(storage)
    if found is None:
        return None
    sizes, strides = found
    if numel <= 1:
        return [0] * len(loop)
    if numel == math.prod(loop):
        return _contiguous(loop)  # the value or a reshape of it, read as laid out
    pad = len(loop) - len(sizes)
    if pad < 0 or any(size not in (1, extent) for size, extent in zip(sizes, loop[pad:])):
        return [BLOCKED] * len(loop)
    return [0] * pad + [stride if size == extent else 0 for size, stride, extent in zip(sizes, strides, loop[pad:])]


def _merged(sizes: list, reads: list[list]) -> tuple:
    """``sizes`` with size-1 dims dropped and each neighbouring pair merged that every read's strides allow."""
    dims = [d for d, s in enumerate(sizes) if s != 1]
    out: list[int] = []
    last = None
    for d in dims:
        if last is not None and all(BLOCKED not in (st[last], st[d]) and st[last] == sizes[d] * st[d] for st in reads):
            out[-1] *= sizes[d]
        else:
            out.append(sizes[d])
        last = d
    return tuple(out)


def loop_sizes(phase, unit: fx.Node) -> tuple | None:
    """(loop sizes, reduction sizes) of a unit's C++ kernel after Inductor's simplification, or None where not
    worked out (see the module docstring)."""
    facts = phase.facts
    if facts.concat_kernel(unit):
        return NO_LOOP
    if not facts.is_tensor(unit) or facts.loop_facts(unit)[1] is not None:
        return None  # a scatter loops over its values, not its output
    reducing = phase.is_reduction(unit)
    if reducing and phase.classes[unit] is not OpClass.REDUCTION:
        return None
    reduced: tuple = ()
    loop_node = unit
    if reducing:
        dims = reduced_dims(unit)
        if len(dims) != 1 or not isinstance(dims[0][0], fx.Node):
            return None
        loop_node, reduced = dims[0]
    found = sizes_strides(loop_node)
    if found is None:
        return None
    loop = found[0]
    reduced = tuple(sorted({d % len(loop) for d in reduced})) if loop else ()
    reads = []
    for storage, paths in phase.access[unit].items():
        if any(paths):
            return None
        strides = _read_strides(storage, loop, facts.numel(storage))
        if strides is None:
            return None
        reads.append(strides)
    kept = [d for d in range(len(loop)) if d not in reduced]
    sizes = _merged([loop[d] for d in kept], [[st[d] for d in kept] for st in reads])
    summed = _merged([loop[d] for d in reduced], [[st[d] for d in reduced] for st in reads])
    return sizes, summed
