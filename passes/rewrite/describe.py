"""describe_split: what a (forward, backward) pair actually keeps and recomputes, read off the final graphs.

The same function describes fxremat's split and PyTorch's, so both sides of every comparison use one definition:
saved bytes are the distinct storages of the tensors forward hands to backward, excluding every graph input's
storage (parameters, buffers, user inputs) — what ``torch.autograd.graph.saved_tensors_hooks`` sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..graph.costs import DeviceProfile, alias_root, node_cost, symbolic_nbytes
from ..graph.ops import qualified_name


@dataclass(frozen=True)
class SavedValue:
    name: str
    op: str
    shape: tuple[int | str, ...]
    dtype: str
    nbytes: int  # hinted
    nbytes_expr: str  # symbolic, e.g. "4*s0*768"
    storage: str  # the node owning the storage this value keeps alive
    counted: bool  # False for graph inputs and for a second view of an already counted storage
    source: str | None  # user source line, when known
    module: str | None = None  # qualified name of the innermost nn.Module that computed it (Dynamo graphs only)
    storage_nbytes: int | None = None  # bytes of the storage it keeps alive: what a counted row adds to saved_bytes


@dataclass(frozen=True)
class RecomputedNode:
    name: str
    op: str
    flops: int
    est_seconds: float


@dataclass(frozen=True)
class SplitDescription:
    saved: tuple[SavedValue, ...]
    saved_symbols: tuple[str, ...]
    recomputed: tuple[RecomputedNode, ...]
    saved_bytes: int
    recompute_flops: int
    recompute_seconds: float


def _source_line(node: fx.Node) -> str | None:
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else None


_MODULE_PATH_PARTS = (
    (re.compile(r"^L\[['\"]self['\"]\]\.?|^self\.?"), ""),  # Dynamo's name for the compiled module itself
    (re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]"), r".\1"),  # ._modules['0'] -> .0
    (re.compile(r"\[['\"]([^'\"]+)['\"]\]"), r".\1"),  # ['fc'] -> .fc
    (re.compile(r"\[(\d+)\]"), r".\1"),  # [0] -> .0 (nn.Sequential, nn.ModuleList)
)


def module_path(node: fx.Node) -> str | None:
    """``blocks.0.fc1`` for a node computed inside ``model.blocks[0].fc1``.  None for the compiled module's own
    code, and for graphs traced without Dynamo (``aot_module`` records no module stack)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    qualified = list(stack.values())[-1][0]
    path = str(qualified)
    for pattern, replacement in _MODULE_PATH_PARTS:
        path = pattern.sub(replacement, path)
    return path.strip(".") or None


def _shape(val) -> tuple[int | str, ...]:
    return tuple(int(s) if not isinstance(s, torch.SymInt) else str(s) for s in val.shape)


def saved_outputs(fw: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    return [a for a in output.args[0][num_fwd_outputs:] if isinstance(a, fx.Node)]


def describe_split(
    fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, profile: DeviceProfile
) -> SplitDescription:
    saved_rows: list[SavedValue] = []
    symbols: list[str] = []
    counted_roots: set[str] = set()
    saved_bytes = 0
    for node in saved_outputs(fw, num_fwd_outputs):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            symbols.append(node.name)
            continue
        root = alias_root(node)
        storage_bytes = node_cost(root, profile).nbytes
        counted = root.op != "placeholder" and root.name not in counted_roots
        if counted:
            counted_roots.add(root.name)
            saved_bytes += storage_bytes
        saved_rows.append(
            SavedValue(
                name=node.name,
                op=qualified_name(node) if node.op == "call_function" else node.op,
                shape=_shape(val),
                dtype=str(val.dtype).removeprefix("torch."),
                nbytes=node_cost(node, profile).nbytes,
                nbytes_expr=symbolic_nbytes(val),
                storage=root.name,
                counted=counted,
                source=_source_line(node),
                module=module_path(node),
                storage_nbytes=storage_bytes,
            )
        )
    recomputed = _recomputed(fw, bw, profile)
    return SplitDescription(
        saved=tuple(saved_rows),
        saved_symbols=tuple(symbols),
        recomputed=tuple(recomputed),
        saved_bytes=saved_bytes,
        recompute_flops=sum(r.flops for r in recomputed),
        recompute_seconds=sum(r.est_seconds for r in recomputed),
    )


def step_seconds(nodes, profile: DeviceProfile) -> float:
    """The step's estimated seconds: every call of ``nodes`` (a split's forward and backward nodes, or a recipe's
    joint nodes in their orders) priced as the recomputation is, by the fusion rule (``NodeCost.recompute_seconds``,
    docs/DESIGN.md §4.1), so that ``est_recompute_seconds`` is a share of it.  ``split.FirstPass`` entries count as
    the node they copy."""
    from .split import FirstPass  # here: the report's module loads this one on a warm compile, never a split

    total = 0.0
    for node in nodes:
        node = node.node if type(node) is FirstPass else node
        if node.op == "call_function":
            total += node_cost(node, profile).recompute_seconds
    return total


def _recomputed(fw: fx.GraphModule, bw: fx.GraphModule, profile: DeviceProfile) -> list[RecomputedNode]:
    """The backward's nodes that compute a forward node again.  A per-phase copy (``phase_copies.py``) counts as a
    recomputation of its original; a first-pass copy of a segmented backward (``split.FIRST_PASS_OF``) counts only
    where the backward holds no other copy of that node (a checkpoint the main pass reads from the first pass, e.g.
    Mixtral's expert ``bmm`` under ``memory_budget=0.2``): a node computed in both passes is counted once here, and
    its second computation in ``segment_recompute_flops``."""
    from ..graph.phase_copies import (
        COPY_OF,  # here: the report's module loads this one on a warm compile, never a split
    )
    from .split import FIRST_PASS_OF

    forward_names = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    nodes = [n for n in bw.graph.nodes if n.op == "call_function"]
    main_copies = {n.meta.get(COPY_OF, n.name) for n in nodes if FIRST_PASS_OF not in n.meta}
    recomputed: list[RecomputedNode] = []
    for node in nodes:
        first_of = node.meta.get(FIRST_PASS_OF)
        original = node.meta.get(COPY_OF, node.name if first_of is None else first_of)
        if original not in forward_names or (first_of is not None and original in main_copies):
            continue
        cost = node_cost(node, profile)
        recomputed.append(RecomputedNode(node.name, qualified_name(node), cost.flops, cost.recompute_seconds))
    return recomputed
