"""region_budget: the activation memory budgets a joint graph's own annotations ask for.

Two forms (``torch/_functorch/partitioners.py``, torch 2.13):

* ``torch.autograd.graph.region_activation_memory_budget(b)`` around part of the forward: every op traced under it
  carries ``b`` in ``node.meta["custom"]`` (read through ``_torch_private.memory_budget_annotation``);
* the legacy ``node.meta["memory_budget"]`` float (the old ``MemoryBudgetMode`` marker): a budget for the whole
  graph, the first one wins.

PyTorch applies one budget per joint graph and refuses annotations that disagree or leave a forward op outside.
fxremat reads them as regions instead (``read_regions``): one region per distinct budget (the annotation records
the budget only, so two ``with`` blocks of equal budget are one region), each held to its own budget in one solve
with the rest of the graph, which keeps the graph's own setting (``passes/choice/regions.py``).  One budget over the
whole forward is the graph's budget, as in PyTorch.  What fxremat cannot apply is still refused, with
``RegionBudgetError``: a subgraph body (a higher-order op's, which the cut keeps or recomputes as one value) whose
ops carry different budgets, or a budget on some of its ops only, and a budget outside [0, 1].
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch.fx as fx

from .. import _torch_private as tp

REGION_SOURCE = "torch.autograd.graph.region_activation_memory_budget"
LEGACY_SOURCE = 'node.meta["memory_budget"]'
_SHOWN = 8  # ops named in an error


class RegionBudgetError(ValueError):
    """Annotations fxremat cannot apply as written."""


@dataclass(frozen=True)
class RegionAnnotations:
    budgets: tuple[float, ...]  # distinct region budgets, in graph order
    uncovered: tuple[str, ...]  # forward ops of the joint graph outside every region

    @property
    def whole_graph_budget(self) -> float | None:
        """The budget of a single region around the whole forward (the graph's budget, as PyTorch reads it)."""
        return self.budgets[0] if len(self.budgets) == 1 and not self.uncovered else None

    @property
    def several(self) -> bool:
        """Regions that are not one budget over the whole forward: per-region budgets."""
        return bool(self.budgets) and self.whole_graph_budget is None


def node_region_budget(node: fx.Node) -> float | None:
    """The budget of the region ``node`` was traced in, or None."""
    budget = tp.memory_budget_annotation(node)
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 <= budget <= 1.0:
        raise RegionBudgetError(
            f"{REGION_SOURCE}: {node.format_node()} carries budget {budget!r}; a budget is a float in [0, 1]."
        )
    return float(budget)


def _check_body(name: str, body: fx.GraphModule) -> list[float]:
    """A subgraph body's budgets: one for all its ops, or none; anything else raises."""
    ops = [n for n in body.graph.nodes if n.op == "call_function"]
    budgets = [node_region_budget(n) for n in ops]
    distinct = sorted({b for b in budgets if b is not None})
    bare = [n.name for n, b in zip(ops, budgets) if b is None]
    if len(distinct) > 1 or (distinct and bare):
        what = (
            f"budgets {distinct}"
            if len(distinct) > 1
            else f"budget {distinct[0]} on some ops only, not {bare[:_SHOWN]}"
        )
        raise RegionBudgetError(
            f"{REGION_SOURCE}: the subgraph body {name!r} carries {what}. fxremat keeps or recomputes a subgraph "
            "(a higher-order op's body) as one value, so it can hold it to one budget only: put the whole "
            "subgraph inside one region (or outside every region)."
        )
    return distinct


def read_regions(joint: fx.GraphModule, num_fwd_outputs: int) -> RegionAnnotations:
    """The graph's region budgets (subgraph bodies included), and the forward ops outside every region."""
    budgets: list[float] = []
    unannotated: list[fx.Node] = []
    for node in joint.graph.nodes:
        budget = node_region_budget(node)
        if budget is None:
            if node.op == "call_function":
                unannotated.append(node)
        elif budget not in budgets:
            budgets.append(budget)
    for name, module in joint.named_modules():
        if isinstance(module, fx.GraphModule) and module is not joint:
            budgets += [b for b in _check_body(name, module) if b not in budgets]
    if not budgets:
        return RegionAnnotations((), ())
    from .roles import forward_nodes  # here: fxremat's backend imports this module for annotation_key alone

    forward = forward_nodes(joint, num_fwd_outputs)  # only where some node is annotated
    return RegionAnnotations(tuple(budgets), tuple(n.name for n in unannotated if n in forward))


def legacy_budget(joint: fx.GraphModule) -> float | None:
    """The legacy ``node.meta["memory_budget"]`` marker: the first one."""
    for node in joint.graph.nodes:
        legacy = node.meta.get("memory_budget")
        if isinstance(legacy, float):
            return legacy
    return None


def annotation_key(gm: fx.GraphModule) -> str:
    """Which ops of a (Dynamo) graph carry which region budget, for a compile-cache key: "" without any.  The
    graph's code does not show the regions, so the same code with other budgets or regions must key apart."""
    budgets = [tp.memory_budget_annotation(n) for n in gm.graph.nodes]
    return repr(budgets) if any(b is not None for b in budgets) else ""


@contextlib.contextmanager
def annotations_hidden(gm: fx.GraphModule, hide: bool = True) -> Iterator[None]:
    """PyTorch's partitioner refuses per-region budgets (several, or one over part of a graph): while it
    partitions such a graph for fxremat (the report's baseline, the fallback), the graph's nodes carry none.  Each
    ``meta["custom"]`` is replaced, not changed (copies of a graph share meta objects), and put back after."""
    key, hidden = tp.MEMORY_BUDGET_ANNOTATION_KEY, []
    graphs = [m.graph for m in gm.modules() if isinstance(m, fx.GraphModule)] if hide else []
    for node in (n for graph in graphs for n in graph.nodes):
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and key in custom:
            hidden.append((node.meta, custom))
            node.meta["custom"] = {k: v for k, v in custom.items() if k != key}
    try:
        yield
    finally:
        for meta, custom in hidden:
            meta["custom"] = custom
