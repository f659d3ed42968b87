"""How Inductor lowers single ops, where that matters for memory: which ops are its own kernels and how they fuse
(``inductor_class``, ``column_reduction``), which become other ops (``addmm_matmul``) or buffers of their own
(``concat_kernel``), what a scatter loops over (``scatter_values``), and which values it stores instead of
recomputing (``ops.HEAVY_OPS``, the read thresholds).  Facts about one node and its neighbours, each with the
Inductor source it follows; ``liveness.py`` builds the step's timeline from them.  The ops these rules name are sets
and constants of ``ops.py`` (``FUSED_LOADS``, ``ADD``, ...): a rule on ops that ``ops.py`` names is a change here only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from .. import _torch_private as tp
from ..graph.costs import hinted_numel, hinted_shape
from ..graph.graph_facts import readers_through_views
from ..graph.ops import (
    ADD,
    BMM,
    CAT,
    FUSED_LOADS,
    INDUCTOR_RANDOM,
    MM,
    POINTWISE_SCATTERS,
    REDUCTIONS_WITH_DIMS,
    OpClass,
    op_class,
    qualified_name,
)
from .phase_graph import PhaseGraph


def _users(node: fx.Node, graph: PhaseGraph | None):
    """``node``'s readers in ``graph`` (a built graph's own users where None)."""
    return node.users if graph is None else graph.users(node)


def readers_in(
    node: fx.Node, classes: dict[fx.Node, OpClass] | None = None, graph: PhaseGraph | None = None
) -> set[fx.Node]:
    """``graph_facts.readers_through_views`` in ``graph`` (a built graph's own users where None)."""
    return readers_through_views(node, classes, None if graph is None else graph.users)


# Kernels Inductor generates itself (and fuses with each other); everything else (matmul, convolution, attention,
# custom ops, collectives) is an extern kernel that runs alone.
KERNEL_CLASSES = frozenset({OpClass.POINTWISE, OpClass.COPY, OpClass.CREATION, OpClass.REDUCTION, OpClass.NORM})


def concat_kernel(node: fx.Node, backend) -> bool:
    """Whether Inductor lowers ``node`` to a ``ConcatKernel``: every ``cat`` on a backend whose rules say so (the C++
    backend's: ``lowering.cat``: "if cpu_device: return ConcatKernel.create"; the pointwise cat is GPU-only).  A
    ConcatKernel is a NopKernel: its buffer is allocated on its own, before the kernels that compute its inputs write
    into their slices (``NonOwningLayout``), so it is never an in-place update of a kernel's input
    (``SchedulerBuffer.allocate`` takes one only inside a real kernel).  A recomputed SwiGLU's backward writes the
    gate's and up's gradients into one fresh gate-and-up-sized buffer while the recomputed projection it reads is still
    live (docs/DESIGN.md §6)."""
    return backend.cat_is_concat_kernel and node.target is CAT and isinstance(node.meta.get("val"), torch.Tensor)


def realized_when_lowered(node: fx.Node) -> bool:
    """Whether Inductor's lowering stores ``node``'s value as a buffer of its own although the op is pointwise:
    ``lowering.inductor_random`` ends with ``result.realize()``, so the random draw is never inlined into its readers.
    The buffer still vanishes where every reader runs in the kernel that writes it (``Kernel.remove_kernel_local_
    buffers``: the draw fused into dropout's multiply in forward), which the walk's kernel-local rule covers; a
    reduction over another loop nest (the ``sum`` of a weight gradient in backward, on CPU a loop of its own in the
    same C++ function) reads it from memory.  ``example("dropout")``: 33,032 B simulated vs 65,808 measured before,
    65,800 after."""
    return node.op == "call_function" and qualified_name(node) == INDUCTOR_RANDOM


def reduced_input(node: fx.Node) -> fx.Node | None:
    """The tensor a reduction (``sum``, ``amax``, ``mean``, ...) reduces, or None for any other op.  Inductor's loop
    for it runs over that tensor's elements (its ranges and reduction ranges are the tensor's shape), however large
    the storages its fused-away producers read slices of: a chunk's loss, summed over its rows of the labels, loops
    over those rows, not over every label, and so fuses with the chunk's log-sum-exp (docs/DESIGN.md §14)."""
    if getattr(node.target, "overloadpacket", None) not in REDUCTIONS_WITH_DIMS or not node.args:
        return None
    x = node.args[0]
    return x if isinstance(x, fx.Node) and isinstance(x.meta.get("val"), torch.Tensor) else None


def column_reduction(node: fx.Node) -> tuple[int, int] | None:
    """(kept, reduced) elements of a reduction that keeps its input's innermost dimension (a column reduction: the
    weight gradient of a norm or a bias sums over the rows), or None.  Such a loop reads its input at index
    ``column + width * row`` with the row reduced, where a pointwise loop or a row reduction over the same input
    reads ``width * row + column`` with the column innermost: Inductor's fusion score counts only reads of equal
    index (``Scheduler.score_fusion_memory`` over ``MemoryDep``s), finds "no shared data" and refuses the fusion
    (``InductorChoices.can_fuse``); two column reductions of one shape read alike and fuse.  So the norms'
    weight-gradient sums of a recomputed Llama stack share one kernel, never the norm backward beside them, and
    that kernel runs where all of them can (docs/DESIGN.md §6)."""
    if getattr(node.target, "overloadpacket", None) not in REDUCTIONS_WITH_DIMS or len(node.args) < 2:
        return None
    x, dims = node.args[0], node.args[1]
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(dims, (list, tuple)) or not dims:
        return None
    shape = hinted_shape(val)
    reduced = {d % len(shape) for d in dims if isinstance(d, int)}
    nontrivial = [d for d, size in enumerate(shape) if size != 1]
    if not nontrivial or nontrivial[-1] in reduced:
        return None
    kept = int(np.prod([size for d, size in enumerate(shape) if d not in reduced]))
    return kept, int(np.prod([shape[d] for d in reduced]))


def inductor_class(node: fx.Node, cls: OpClass, graph: PhaseGraph | None = None, *, backend) -> OpClass:
    """The op class as Inductor's code generation sees it, where that differs from ours: gathers are loads fused
    into their readers, scatters are kernels their values' producers fuse into, and on CPU a ``bmm`` with one row or
    one column per batch (``kernel/bmm.py``: M == 1 or N == 1, e.g. MoE experts applied one token at a time) is
    lowered to a multiply and a sum, a reduction kernel into which its operands' producers fuse (a recomputed gather
    of expert weights never exists whole; ``SchedulingRules.bmm_is_reduction`` of the ``backend``; Mixtral,
    docs/DESIGN.md §6)."""
    target = getattr(node, "target", None)
    packet = getattr(target, "overloadpacket", None)
    if cls is OpClass.GATHER:
        # a load fuses into its reader; a scatter is a kernel that reads its values through a loader, so the
        # pointwise producer of those values (an outer product of MoE weight gradients) never exists whole
        return OpClass.POINTWISE if packet in FUSED_LOADS or packet in POINTWISE_SCATTERS else OpClass.REDUCTION
    if cls is OpClass.POINTWISE and addmm_matmul(node, graph, backend=backend) is not None:
        return OpClass.MATMUL
    if cls is OpClass.REDUCTION and unrolled_reduction(node):
        return OpClass.POINTWISE
    if cls is OpClass.MATMUL and packet is BMM and len(node.args) >= 2:
        a, b = (arg.meta.get("val") if isinstance(arg, fx.Node) else None for arg in node.args[:2])
        tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        if tensors and a.dim() == 3 and backend.bmm_is_reduction(a, b):
            return OpClass.REDUCTION
    return cls


# Inductor unrolls a reduction over fewer elements than this into a pointwise sum
# (``config.unroll_reductions_threshold``)
UNROLL_REDUCTIONS_THRESHOLD = 8


def unrolled_reduction(node: fx.Node) -> bool:
    """Whether Inductor lowers the reduction ``node`` as a pointwise value: ``ir.Reduction.create`` (and
    ``WelfordReduction.create``, for ``var_mean``) returns a ``Pointwise`` whose loader adds the few elements up where
    fewer than ``config.unroll_reductions_threshold`` (8) are reduced into each of several outputs, so it is no buffer
    and fuses into its readers like any pointwise value.  GPT-2's position-embedding gradient: the sum over the batch
    (2) of the gradient is loaded inside the scatter into the embedding's gradient, never stored (output code:
    ``tmp10 + tmp11``, two loads 32768 apart, inside the scatter's loop)."""
    return unrolled_elements(node) > 0


def unrolled_elements(node: fx.Node) -> int:
    """How many elements an unrolled reduction (``unrolled_reduction``) adds up into each output, 0 where ``node`` is
    no such reduction: its loader computes its input once per element, each at another index, so loads each of that
    computation's reads once per element (``ir.Reduction._unroll_reduction_fn``: ``value_fn(index, rindex)`` for every
    ``rindex`` of the reduced ranges)."""
    src, out = reduced_input(node), node.meta.get("val")
    if src is None:
        return 0
    out_numel = hinted_numel(out[0] if isinstance(out, (tuple, list)) else out)
    if out_numel <= 1:
        return 0  # a full reduction to one element is never unrolled on CPU (``sympy_product(ranges) != 1``)
    src_numel = hinted_numel(src.meta["val"])
    if src_numel >= UNROLL_REDUCTIONS_THRESHOLD * out_numel:
        return 0
    return max(1, src_numel // out_numel)


def _hinted_layout(val: torch.Tensor) -> list[int]:
    return [*hinted_shape(val), *(tp.size_hint(s) for s in val.stride())]


def _noop_view_source(node: fx.Node, graph: PhaseGraph | None = None) -> fx.Node:
    """What a chain of views that changes nothing (the same shape and strides at both ends: a permute and its
    inverse), each read only by the next, reads from: Inductor drops such views (``pointless_permute_pair``) before
    it matches patterns.  ``node`` itself when it is no such chain."""
    val = node.meta.get("val")
    src = node
    while (
        src.op == "call_function"
        and getattr(src.target, "is_view", False)
        and src.args
        and isinstance(src.args[0], fx.Node)
        and len(_users(src.args[0], graph)) == 1
        and (graph is None or src not in graph.inputs)
    ):
        src = src.args[0]
    if src is node:
        return node  # no view to look through (most reads): nothing to compare
    found = src.meta.get("val")
    same = isinstance(val, torch.Tensor) and isinstance(found, torch.Tensor)
    return src if same and _hinted_layout(val) == _hinted_layout(found) else node


def addmm_matmul(node: fx.Node, graph: PhaseGraph | None = None, *, backend) -> fx.Node | None:
    """The ``mm`` Inductor folds into this ``add``, or None.  Its post-grad pass rewrites ``add(mm(a, b), c)`` (either
    order, the mm read by nothing else, ``c`` a tensor of their dtype that broadcasts to the product) into one
    ``addmm(c, a, b)``: an extern kernel whose output is the sum, so the product never exists alone and the sum
    does not fuse into its readers (``fx_passes/post_grad.py: addmm``; on a GPU only when some reader of the sum is
    not pointwise).  T5's tied embedding gradient (lm_head's product plus the embedding's scatter) is one.  Of two
    products (a weight read twice: its two gradients summed) the second is folded: ``add(inp, mm)`` is the pattern
    registered first, so tried first; the first product is computed where it stands, its inputs freed there."""
    if node.op != "call_function" or node.target is not ADD or len(node.args) != 2 or node.kwargs:
        return None
    for mm_arg, other in (node.args[::-1], node.args):
        if not isinstance(mm_arg, fx.Node) or not isinstance(other, fx.Node):
            return None
        mm = _noop_view_source(mm_arg, graph)
        if mm.target is not MM or (graph is not None and mm in graph.inputs):
            continue  # no product, or a graph input: no product this graph computes
        if len(_users(mm_arg, graph)) != 1 or len(_users(mm, graph)) != 1:
            continue
        a, b = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in mm.args[:2])
        c = other.meta.get("val")
        if not all(isinstance(t, torch.Tensor) for t in (a, b, c)) or not c.dtype == a.dtype == b.dtype:
            continue
        product = [tp.size_hint(a.shape[0]), tp.size_hint(b.shape[1])]
        shape = hinted_shape(c)
        if len(shape) > 2 or any(s not in (1, p) for s, p in zip(reversed(shape), reversed(product))):
            continue
        if backend.keeps_mm_before_pointwise_readers and _only_pointwise_readers(node, graph):
            continue  # Inductor keeps mm + a pointwise add (``should_prefer_unfused_addmm``)
        return mm
    return None


def _only_pointwise_readers(node: fx.Node, graph: PhaseGraph | None = None) -> bool:
    """``torch._inductor.utils.is_pointwise_use`` for every reader: pointwise, looking through views."""
    return all(op_class(u) is OpClass.POINTWISE for u in readers_in(node, graph=graph))


def folded_into_addmm(node: fx.Node, classes: dict[fx.Node, OpClass], graph: PhaseGraph | None, backend) -> bool:
    if node.target is not MM:
        return False
    readers = readers_in(node, classes, graph)
    return len(readers) == 1 and addmm_matmul(next(iter(readers)), graph, backend=backend) is node


def scatter_values(node: fx.Node) -> fx.Node | None:
    """The values a scatter writes (its largest tensor argument, not counting the tensor it scatters into, which
    has the output's shape), or None for a gather.  Inductor's scatter kernel loops over them: a scatter fuses with
    the kernel that computes its values (T5's and GPT-2's embedding gradients, ``_unsafe_masked_index_put_accumulate``
    over the rows' gradients, run inside the norm backward that produces those), and its output is filled
    beforehand (the zeros it starts from are fused into that fill)."""
    if getattr(node.target, "overloadpacket", None) in FUSED_LOADS:
        return None
    out = node.meta.get("val")
    args = [a for a in node.args if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]
    if args and args[0] is node.args[0] and isinstance(out, torch.Tensor):
        if hinted_shape(args[0].meta["val"]) == hinted_shape(out):
            args = args[1:]  # ``self``, the tensor scattered into
    return max(args, key=lambda a: hinted_numel(a.meta.get("val")), default=None)


# A value computing one of ``ops.HEAVY_OPS`` is stored, not recomputed, when several nodes read it on CPU
# (``_realized_on_reuse``), past this many reads:
REALIZE_READS_THRESHOLD = 4  # torch._inductor.config.realize_reads_threshold
