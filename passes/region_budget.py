"""region_budget: the activation memory budget a joint graph's own annotations ask for, read as PyTorch reads it.

Two forms, in PyTorch's order of precedence (``torch/_functorch/partitioners.py``, torch 2.13):

* ``torch.autograd.graph.region_activation_memory_budget(b)`` around the forward: every op traced under it carries
  ``b`` in ``node.meta["custom"]`` (read through ``_torch_private.memory_budget_annotation``);
* the legacy ``node.meta["memory_budget"]`` float (the old ``MemoryBudgetMode`` marker): the first one wins.

PyTorch applies one budget per joint graph, so, as PyTorch does, annotations that disagree and an annotation that
leaves some forward op (or an op of a subgraph body) uncovered are errors: ``RegionBudgetError`` names the budgets
or the uncovered ops, and the fix (a graph break between regions that need different budgets).
"""

from __future__ import annotations

import torch.fx as fx

from . import _torch_private as tp

REGION_SOURCE = "torch.autograd.graph.region_activation_memory_budget"
LEGACY_SOURCE = 'node.meta["memory_budget"]'
_SHOWN = 8  # uncovered ops named in the error


class RegionBudgetError(ValueError):
    """Annotations that give a joint graph no single budget."""


def _forward_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> set[fx.Node]:
    """Ancestors of the forward outputs (PyTorch's ``is_required_fw``)."""
    fwd_outputs, _ = tp.extract_fwd_bwd_outputs(joint, num_fwd_outputs)
    forward: set[fx.Node] = set()
    stack = [o for o in fwd_outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in forward:
            forward.add(node)
            stack.extend(node.all_input_nodes)
    return forward


def _annotations(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[list[float], list[fx.Node]]:
    """(distinct budgets in graph order, forward ops without one), subgraph bodies included."""
    budgets: list[float] = []
    unannotated: list[tuple[fx.Node, bool]] = []  # (op, in a subgraph body: every op there must be covered)
    graphs = [(joint.graph, False)]
    graphs += [(m.graph, True) for m in joint.modules() if isinstance(m, fx.GraphModule) and m is not joint]
    for graph, in_body in graphs:
        for node in graph.nodes:
            budget = tp.memory_budget_annotation(node)
            if budget is not None:
                if budget not in budgets:
                    budgets.append(budget)
            elif node.op == "call_function":
                unannotated.append((node, in_body))
    if not budgets:
        return budgets, []
    forward = _forward_nodes(joint, num_fwd_outputs)  # only where some node is annotated
    return budgets, [n for n, in_body in unannotated if in_body or n in forward]


def region_budget(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[float | None, str | None]:
    """(budget, where it came from: ``REGION_SOURCE`` or ``LEGACY_SOURCE``), or (None, None) without annotations."""
    budgets, uncovered = _annotations(joint, num_fwd_outputs)
    if len(budgets) > 1:
        raise RegionBudgetError(
            f"{REGION_SOURCE}: conflicting budgets in one joint graph (subgraphs included): {sorted(budgets)}. "
            "fxremat, like PyTorch, applies one budget per graph: put a graph break (torch._dynamo.graph_break()) "
            "between regions that need different budgets, or use one budget for both."
        )
    if budgets:
        if uncovered:
            names = [n.name for n in uncovered[:_SHOWN]]
            more = f" and {len(uncovered) - _SHOWN} more" if len(uncovered) > _SHOWN else ""
            raise RegionBudgetError(
                f"{REGION_SOURCE}({budgets[0]}) must cover the whole forward of a graph, but {len(uncovered)} "
                f"forward op(s) are outside it: {names}{more}. Wrap the whole forward in one region, or put a "
                "graph break (torch._dynamo.graph_break()) at the region's edges so that it is a graph of its own "
                "(a graph break inside the region also leaves ops outside it)."
            )
        return float(budgets[0]), REGION_SOURCE
    for node in joint.graph.nodes:
        legacy = node.meta.get("memory_budget")
        if isinstance(legacy, float):
            return legacy, LEGACY_SOURCE
    return None, None
