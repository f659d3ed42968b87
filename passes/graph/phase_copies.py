"""One copy per phase of an expanding gather that both the forward and the backward read.

An expanding gather picks rows of a small table by index into a much larger tensor: Mixtral's ``batched_mm``
experts gather each token's expert weights (``gate_up_proj[expert_ids]``: tokens x 2*ffn x hidden from a table of
experts x 2*ffn x hidden) and feed the gather to a ``bmm``, in forward for the projection and in backward for the
input's gradient.  Inductor never stores it while it has one reader: the CPU ``bmm`` lowering of a
matrix-vector product (``kernel/bmm.py``) is a multiply and a sum, into which the gather fuses.  But a value with
several readers, one of them a ``bmm``, is stored (``GraphLowering.run_node`` asks ``realize_hint``; DESIGN §6 and
``phase._Phase._realized_on_reuse``).  So a plan that recomputes the forward ``bmm`` in backward, where the
gradient's ``bmm`` reads the same gather, makes Inductor store the whole gather, many times the rest of the step
(the benchmarks' small Mixtral; docs/DESIGN.md §6).

The joint graph has one gather node for both readers (PyTorch's CSE merged them).  Giving the backward's readers a
copy of their own keeps every plan's gather single-reader in each graph: the forward's copy serves the forward's
readers (and their recomputation), the backward's copy the backward's.  Both are cheap to recompute (a row
lookup, read where it is used) and never worth saving, so the cut decides nothing differently on plans where the
forward's readers are not recomputed; on those where they are, the store disappears.  The copy is marked
``COPY_OF`` so that the report counts it as a recomputation of the original.
"""

from __future__ import annotations

import copy

import torch
import torch.fx as fx

from .. import _torch_private as tp
from .costs import value_nbytes
from .ops import ROW_LOOKUPS
from .roles import forward_nodes

COPY_OF = "fxremat_copy_of"  # meta key: the name of the node this one computes again


def _bytes(node) -> int:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return 0
    try:
        return int(value_nbytes(val))
    except TypeError:  # symbolic: no copy decided on a size we cannot compare
        return 0


def _expanding_gather(node: fx.Node) -> bool:
    """A row lookup larger than everything it reads, read by an op whose inputs Inductor realizes."""
    if node.op != "call_function" or node.target not in ROW_LOOKUPS:
        return False
    reads = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if len(reads) < 2:
        return False
    size = _bytes(node)
    return size > sum(_bytes(a) for a in reads) and any(tp.realizes_inputs(u) for u in node.users)


def copy_gathers_per_phase(joint: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    """Give the readers outside the forward of every expanding gather the forward reads a copy of their own
    (see the module docstring), in place; returns the copies."""
    graph = joint.graph
    candidates = [n for n in graph.nodes if _expanding_gather(n)]
    if not candidates:
        return []
    forward = forward_nodes(joint, num_fwd_outputs)
    position = {n: i for i, n in enumerate(graph.nodes)}
    copies = []
    for node in candidates:
        later = [u for u in node.users if u not in forward]
        if node not in forward or not later or any(u.op == "output" for u in later):
            continue
        with graph.inserting_before(min(later, key=position.__getitem__)):
            twin = graph.node_copy(node, lambda a: a)
        twin.meta = copy.copy(node.meta)
        twin.meta[COPY_OF] = node.meta.get(COPY_OF, node.name)
        for user in later:
            user.replace_input_with(node, twin)
        copies.append(twin)
    return copies
