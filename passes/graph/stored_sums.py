"""Block sums: the sums a residual stream is made of, which the default plan may save in place of the extern
kernel's output they add (fewer C++ sources per compile; docs/DESIGN.md §8).

A block sum is a forward pointwise value ``v = x + e`` where ``e`` is an extern kernel's output (matmul,
convolution, attention) at least as large as ``v`` that nothing else in forward reads, and ``v`` itself has more
than one forward reader (a norm and the next block's sum).  Saving ``e`` or ``v`` keeps the same bytes; the cut's
save traffic (``costs.save_traffic_bytes``) charges ``v`` a forward write that ``e`` does not pay, so the cut saves
``e`` and backward recomputes ``v`` from ``x``, and ``x`` from the block before: every layer's norm backward then
computes a sum one term longer than the layer after it, a kernel source of its own (one more C++ compile per layer).
Where ``v``'s readers fall into two kernels (an extern kernel between them) that write is not extra: Inductor would
compute ``v`` inside each of them, reading ``e`` again (``StorageBox.should_realize_on_reuse``, ir.py, stores it
only past ``realize_reads_threshold`` reads).  ``reads_only`` gives the problem in which a block sum's save costs
its read alone, for ``passes/choice/default.py`` to try against the default plan (it keeps the default plan
unless the other saves no more bytes and its simulated step peak is no higher).
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from ..solver.parametric import ParametricProblem
from .graph_facts import GraphFacts, readers_through_views
from .ops import OpClass
from .roles import GraphRoles, Role

EXTERN = frozenset({OpClass.MATMUL, OpClass.CONVOLUTION, OpClass.ATTENTION})


def _forward_readers(node: fx.Node, forward: frozenset, classes: dict) -> set[fx.Node]:
    return {u for u in readers_through_views(node, classes) if u in forward}


def _extern_output(arg: fx.Node, classes: dict) -> fx.Node | None:
    """The extern kernel's output ``arg`` is (or views), or None: an item of an attention op counts as its own."""
    while classes.get(arg) is OpClass.VIEW and arg.args and isinstance(arg.args[0], fx.Node):
        arg = arg.args[0]
    cls = classes.get(arg)
    if cls is OpClass.GETITEM and isinstance(arg.args[0], fx.Node) and classes.get(arg.args[0]) in EXTERN:
        return arg
    return arg if cls in EXTERN else None


def is_block_sum(node: fx.Node, forward: frozenset, facts: GraphFacts) -> bool:
    classes = facts.op_class
    if classes.get(node) is not OpClass.POINTWISE or node not in forward:
        return False
    if len(_forward_readers(node, forward, classes)) < 2:
        return False
    size = facts.nbytes[node]
    for arg in facts.inputs_of[node]:
        extern = _extern_output(arg, classes)
        if extern is not None and facts.nbytes[extern] >= size and _forward_readers(extern, forward, classes) == {node}:
            return True
    return False


def block_sums(roles: GraphRoles, nodes: tuple[fx.Node, ...]) -> list[int]:
    """Indices into ``nodes`` (a flow problem's values) of the block sums."""
    forward = frozenset(roles.nodes_with(Role.FORWARD))
    return [i for i, n in enumerate(nodes) if is_block_sum(n, forward, roles.facts)]


def reads_only(problem: ParametricProblem, values: list[int], bandwidth: float) -> ParametricProblem:
    """``problem`` with the save traffic of ``values`` cut to one read of their storage (those that may be saved)."""
    traffic = list(problem.traffic_seconds)
    for v in values:
        if traffic[v] is not None:
            traffic[v] = min(traffic[v], problem.value_bytes(v) / bandwidth)
    return dataclasses.replace(problem, traffic_seconds=tuple(traffic))
