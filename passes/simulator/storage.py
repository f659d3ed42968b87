"""Which values Inductor stores: a node's ``storage_kind`` (never, always, or only where a reader does not fuse it
away) and, in one graph, whether it ``materialises``.  Read by every phase (``phase.py``), by a plan's joint memory
(``plan_memory.py``) and by the backward's segmentation (``rewrite/segments.py``).  docs/DESIGN.md §6."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..graph.ops import FUSIBLE, OpClass
from .lowering import concat_kernel, folded_into_addmm, readers_in, realized_when_lowered
from .phase_graph import PhaseGraph

# Readers a fusible producer folds into (Inductor's pointwise fusion, reduction prologues); views are looked through.
FUSES_INTO = (FUSIBLE - {OpClass.VIEW, OpClass.GETITEM}) | {OpClass.REDUCTION, OpClass.NORM}

# How a node's output is held: never (views, tuples, placeholders, in-place mutations), always, or only when some
# reader does not fuse it away (``materialises``).
NEVER, ALWAYS, FUSIBLE_VALUE = 0, 1, 2


def storage_kind(node: fx.Node, classes: dict[fx.Node, OpClass], graph: PhaseGraph | None = None, *, backend) -> int:
    cls = classes[node]
    if cls is OpClass.GETITEM:
        # an item of a multi-output op (SDPA, var_mean) owns its storage; an item of a view tuple (split) does not
        parent = node.args[0]
        owns = classes.get(parent) is not OpClass.VIEW and isinstance(node.meta.get("val"), torch.Tensor)
        return ALWAYS if owns else NEVER
    if isinstance(node.meta.get("val"), (tuple, list)):
        return NEVER  # the tuple itself holds nothing: its items are allocated (above)
    if cls in (OpClass.VIEW, OpClass.SYMBOLIC, OpClass.PLACEHOLDER, OpClass.OUTPUT):
        return NEVER
    if cls is OpClass.MUTATION:
        return NEVER  # writes into an existing storage (e.g. BatchNorm's running stats)
    if cls is OpClass.MATMUL and folded_into_addmm(node, classes, graph, backend):
        return NEVER  # the addmm that reads it writes the product and the sum at once (``addmm_matmul``)
    if cls is OpClass.POINTWISE and realized_when_lowered(node):
        return ALWAYS
    if concat_kernel(node, backend):
        return ALWAYS  # a ConcatKernel's buffer is stored whatever reads it (``lowering.concat_kernel``)
    return FUSIBLE_VALUE if cls in FUSIBLE else ALWAYS


def materialises(
    node: fx.Node,
    classes: dict[fx.Node, OpClass],
    outputs: set[fx.Node],
    graph: PhaseGraph | None = None,
    kind: int | None = None,
    backend=None,
) -> bool:
    """Whether ``node``'s value is stored (``kind``: its ``storage_kind``, where the caller has it; else the
    ``backend``'s)."""
    if kind is None:
        kind = storage_kind(node, classes, graph, backend=backend)
    if kind != FUSIBLE_VALUE:
        return kind == ALWAYS
    if node in outputs:
        return True
    # A returned reader fuses it like any other: Inductor computes a value inside each kernel that reads it, whether
    # or not that kernel's result is returned (the zeros a gradient's index_put starts from never exist alone).
    readers = readers_in(node, classes, graph)
    return not (readers and all(classes[u] in FUSES_INTO for u in readers))
