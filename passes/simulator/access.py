"""Where a kernel reads a storage (its access paths): the layout of each read between its loop and the storage, and
the ops other than elementwise ones (a slice_backward, a cat) that the value passes through inside the kernel.

Inductor scores a fusion by the bytes two nodes read or write *at the same index* (``Scheduler.score_fusion_memory``
in torch/_inductor/scheduler.py: ``common_memory_deps``, equal ``MemoryDep`` s, name and index); only a pair with no
such read falls back to the bytes of the buffers they share at other indices
(``_score_fusion_memory_by_buffer_overlap``), and every pair with a same-index read outranks every pair without
(``InductorChoices.score_fusion`` in torch/_inductor/choices.py: ``memory_score`` before ``buffer_overlap_score``).
E.g. RoPE: every layer's forward reads the cos and sin tables at the loop's own index, its backward reads sin at
``c3 + 32`` and ``c3 - 32`` (the transposed ``rotate_half``): the forward of one layer fuses with the forward of
another (64 KiB shared at one index), not with the nearer backward (32 KiB, cos only). Two reads of one storage
through equal paths are taken to be at the same index; a read of a value as laid out (or a reshape of it) adds
nothing to a path, so a norm and its backward reading the same input through a reshape still match.
"""

from __future__ import annotations

import torch.fx as fx

from ..graph.ops import BMM, REDUCTIONS_WITH_DIMS, OpClass
from .rules import MOST_READS_COMPARED

MAX_PATHS = 4  # per read storage; a computation reading one storage in more ways is rare (and scored as any other)
MAX_DEPTH = 12  # descriptors kept per path


def _plain(arg):
    if isinstance(arg, fx.Node):
        return "*"
    if isinstance(arg, (list, tuple)):
        return tuple(_plain(a) for a in arg)
    return repr(arg)


def _descriptor(node: fx.Node) -> tuple:
    args = tuple(_plain(a) for a in node.args[1:])
    kwargs = tuple(sorted((k, _plain(v)) for k, v in node.kwargs.items()))
    return (str(node.target), args, kwargs)


def layout(node: fx.Node) -> tuple:
    """Where a read of ``node``'s value lands in its storage: its sizes and strides with size-1 dims dropped and
    contiguous dims merged, and its offset (Inductor simplifies a read's index the same way, ``simplify_loops``: a
    reshape of a contiguous tensor reads at the index of the tensor itself, a slice or a transpose elsewhere)."""
    val = node.meta.get("val")
    try:
        sizes, strides, offset = list(val.shape), list(val.stride()), val.storage_offset()
    except (AttributeError, TypeError, RuntimeError):  # not a tensor
        return (_plain(tuple(getattr(val, "shape", ()))),)
    if not all(type(s) is int for s in (*sizes, *strides, offset)):
        # symbolic: int() would add a guard (a recompile per shape, tests/robustness/test_dynamic_shapes.py); the
        # expressions themselves say where the read lands
        return (tuple(map(str, sizes)), tuple(map(str, strides)), str(offset))
    return (_merged(list(zip(sizes, strides))), offset)


def step(arg: fx.Node, root: fx.Node, layout_of=layout) -> tuple:
    """The part of a path one read adds: nothing when it reads ``root``'s value as laid out (the value itself, or a
    reshape of it), the read's layout otherwise (a slice, a transpose, a broadcast).  ``layout_of``: ``layout``,
    or a memo of it (``NodeFacts``: a node's layout is fixed by its value)."""
    if arg is root:
        return ()
    here = layout_of(arg)
    return () if here == layout_of(root) else (here,)


def through(node: fx.Node, classes: dict[fx.Node, OpClass]) -> tuple:
    """What a value computed inside the kernel adds to the paths of its own reads: nothing for an elementwise op (it
    reads each input at its own index; a broadcast shows in the input's shape, first on its path), itself
    otherwise (a slice_backward, a cat)."""
    if classes.get(node) is OpClass.POINTWISE:
        return ()
    return op_path(node)


def op_path(node: fx.Node) -> tuple:
    """What a value computed inside a kernel by an op other than an elementwise one adds to a path (``through``)."""
    return (_descriptor(node), layout(node))


# The first element of a path read at another index than its storage is written at (``another_index``).
ANOTHER_INDEX = "another index"
# Whether such reads are told apart at all (off: every read of a reduction is taken to be at its producer's index,
# the simpler rule this one refines; docs/DESIGN.md §6).
VERTICAL_INDEX_RULE = True


def reduced_dims(node: fx.Node) -> tuple:
    """(argument, its reduced dimensions) of each tensor a reduction reads in its loop: ``bmm(a, b)`` lowered to a
    multiply and a sum (``lowering.inductor_class``: ``tuned_bmm``, ``L.sum_(L.mul(a[..., None], b[:, None]),
    axis=2)``) sums over a's dimension 2 and b's dimension 1; a ``sum``/``mean``/... over its listed dimensions."""
    packet = getattr(node.target, "overloadpacket", None)
    args = node.args
    if packet is BMM and len(args) >= 2:
        return ((args[0], (2,)), (args[1], (1,)))
    if packet in REDUCTIONS_WITH_DIMS and len(args) >= 2 and isinstance(args[1], (list, tuple)) and args[1]:
        return ((args[0], tuple(args[1])),)
    return ()


def another_index(node: fx.Node) -> dict:
    """The arguments that the reduction ``node`` (an Inductor reduction kernel on CPU) reads out of their storage's
    order -> the first element of their path (``ANOTHER_INDEX``, then (size, stride) in loop order).

    A reduction's loop runs over its kept dimensions, then its reduced ones, and Inductor reorders loops only within
    each (``ComputedBuffer.simplify_and_reorder``; the C++ backend never reorders a node's loops to match another's:
    ``Scheduler.shared_data_after_reordering_loop`` returns at once on CPU).  So where a reduced dimension has a
    larger stride than a kept one (a sum over rows, the one-column ``bmm`` of a transposed weight: Mixtral's input
    gradient), the read's index is not the one its producer writes at: Inductor finds no equal ``MemoryDep``
    (``Scheduler.score_fusion_memory``) and never fuses the producer into it (``Fusion.reads_at_another_index``)."""
    found: dict = {}
    if not VERTICAL_INDEX_RULE:
        return found
    for arg, reduced in reduced_dims(node):
        read = sizes_strides(arg) if isinstance(arg, fx.Node) else None
        if read is None:
            continue  # not a tensor, or symbolic: never a guard (``layout``); taken to be read in order
        sizes, strides = read
        reduced = {d % len(sizes) for d in reduced if type(d) is int}
        kept = _merged([(sizes[d], strides[d]) for d in range(len(sizes)) if d not in reduced])
        summed = _merged([(sizes[d], strides[d]) for d in sorted(reduced)])
        kept_strides = [st for _, st in kept if st != 0]
        summed_strides = [st for _, st in summed if st != 0]
        if kept_strides and summed_strides and min(kept_strides) < max(summed_strides):
            found[arg] = (ANOTHER_INDEX, kept, summed)
    return found


def sizes_strides(node: fx.Node) -> tuple[list[int], list[int]] | None:
    """A tensor value's sizes and strides as integers, or None (not a tensor; symbolic, where ``int()`` would add a
    guard)."""
    val = node.meta.get("val")
    try:
        sizes, strides = list(val.shape), list(val.stride())
    except (AttributeError, TypeError, RuntimeError):
        return None
    if not all(type(s) is int for s in (*sizes, *strides)):
        return None
    return sizes, strides


def _merged(dims: list) -> tuple:
    """(size, stride) dimensions in loop order, size-1 ones dropped and contiguous ones merged (``layout`` and
    ``another_index``): a sum over a [2, 128, 256] value's first two dimensions reads it as one over a [256, 256] view
    of it does."""
    out: list[tuple[int, int]] = []
    for size, stride in dims:
        if size == 1:
            continue
        if out and out[-1][1] == stride * size:
            out[-1] = (out[-1][0] * size, stride)
        else:
            out.append((size, stride))
    return tuple(out)


def at_another_index(path: tuple) -> bool:
    """Whether a read through ``path`` is at another index than its storage is written at (``another_index``)."""
    return bool(path) and type(path[0]) is tuple and path[0][:1] == (ANOTHER_INDEX,)


def add_paths(into: dict, root: fx.Node, paths) -> None:
    known = into.setdefault(root, set())
    for p in paths:
        if len(known) >= MAX_PATHS:
            return
        known.add(p[:MAX_DEPTH])


# Loads kept per computation (``add_loads``): no backend's rule compares a count of them with more than this.
MAX_LOADS = MOST_READS_COMPARED + 1


def add_loads(into: set, loads, elements: int = 1) -> None:
    """Add ``loads`` to ``into``: (storage, the read's own layout against it (``step``), the elements of unrolled
    reductions it is loaded for).  ``elements`` > 1 for an unrolled reduction (``lowering.unrolled_elements``),
    which loads each once per element, at another index.  Inductor's count of a value's reads
    (``Loops.num_reads``, torch/_inductor/ir.py) is that of its loader's distinct ``load(name, index)`` calls
    (``OpCounterCSE.load``, ops_handler.py: a repeated one is common-subexpression-eliminated), fused-away values'
    loads included, as it computes them inside.  The index is taken from the read's own layout only (a slice's
    offset, a transpose): the ops between it and the kernel's loop (an expand, a ``where``) mostly broadcast, which
    leaves the index as it is (a cross-entropy backward reading its labels through both branches of a ``where``: one
    load).  A load an inner unrolled reduction made is not multiplied again: Mixtral's router weights divided by
    their own top-2 sum and summed over the two experts load each weight once, not once per outer element, at the
    two indices the inner and the outer sum share (so an element is known by its number alone)."""
    for storage, step, made in loads:
        for k in range(elements if elements > 1 and not made else 1):
            if len(into) >= MAX_LOADS:
                return
            into.add((storage, step, (k,) if elements > 1 and not made else made))


def add_horizontal(
    candidates: dict, storage: fx.Node, nbytes: int, units: list, orders: list, access: dict, reach: int
) -> None:
    """Score each pair of ``units`` (loops of one size, in order) that read ``storage`` at most ``reach`` apart:
    ``candidates[(a, b)]`` is [bytes read at the same index, bytes read at another]."""
    for i, a in enumerate(units):
        for j in range(i + 1, len(units)):
            if orders[j] > orders[i] + reach:
                break
            b = units[j]
            score = candidates.setdefault((a, b), [0, 0])
            same = access[a].get(storage, _NONE) & access[b].get(storage, _NONE)
            score[0 if same else 1] += nbytes


def priority(score: list) -> tuple:
    """Inductor's order of fusions by memory: same-index bytes first; of pairs with none, the shared buffers' bytes."""
    exact, other = score
    return (-exact, -other if exact == 0 else 0)


_NONE: frozenset = frozenset()
