"""Dead code elimination and CSE on the joint graph, decided in one pass (``plan_clean_up``), then done to the graph
itself (``CleanUp.apply``).

The graph that comes out is the one PyTorch's partitioner works on (``Graph.eliminate_dead_code`` in place, then
``fx_graph_cse``): the same nodes, names, order and ``node.meta`` (including the ``mutation_region_id`` marks
PyTorch's CSE leaves behind).  Differences: no node is copied (PyTorch's CSE copies the whole graph), and a merge
key is built by a small recursive walk instead of pytree (the cost of ``fx_graph_cse``), with the same meaning:

* never merged: placeholders, outputs, ``get_attr``; random ops (PyTorch's ``rand_ops``) and ``aten.empty``;
  anything aliasing a graph output's storage (outputs that are separate tensors in eager stay separate);
  nodes whose value is an unbacked symbol;
* two nodes merge when they have the same target and the same arguments (nodes compared after merging,
  each constant with its type: ``1`` and ``1.0`` and ``True`` differ; SymInts by their SymNode), and lie in the
  same mutation region (no mutating op between them); a duplicate in a later region replaces the earlier one as
  the node later duplicates merge into.

Argument structures the walk does not know (anything but tuples, lists, dicts and plain constants) are keyed
through pytree exactly as PyTorch does.  ``tests/passes/test_cse.py`` compares the result with PyTorch's on every
example model and the fuzzer's models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .. import _torch_private as tp
from .ops import EMPTY

log = logging.getLogger(__name__)

_LEAF_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SEQUENCES = (tuple, list, fx.immutable_collections.immutable_list)
_MAPPINGS = (dict, fx.immutable_collections.immutable_dict)


class _UnknownStructure(Exception):
    pass


def _key(value, env):
    """A hashable stand-in for an argument structure: equal keys <=> equal pytree leaves (each with its type)
    and equal pytree structure, after replacing merged nodes."""
    if isinstance(value, fx.Node):
        return env[value]  # a node equals only itself: no constant's key can equal it
    cls = type(value)
    if cls in _SEQUENCES:
        return (cls, tuple([_key(v, env) for v in value]))
    if cls in _MAPPINGS:
        return (cls, tuple(value.keys()), tuple([_key(v, env) for v in value.values()]))
    if isinstance(value, _SYM_TYPES):
        return (value.node, cls)
    if cls in _LEAF_TYPES:
        return (value, cls)
    raise _UnknownStructure(cls)


def _pytree_key(args, env):
    """PyTorch's own key, for argument structures ``_key`` does not know."""
    leaves, spec = pytree.tree_flatten(args)
    out = []
    for v in leaves:
        if isinstance(v, fx.Node) and v in env:
            v = env[v]
        if isinstance(v, _SYM_TYPES):
            v = v.node
        out.append((v, type(v)))
    return (tuple(out), str(spec))


def _storage(node: fx.Node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tp.storage_identity(val)
    except NotImplementedError:
        return None


def impurity_test() -> Callable[[fx.Node], bool]:
    """``Node.is_impure`` with the random-op setting PyTorch's dead code elimination uses, cached per op (for an
    OpOverload the rule reads only the op): what DCE here and the split (``split.py``) both keep."""
    impure_random = tp.dce_impure_random()
    by_target: dict = {}

    def impure(node: fx.Node) -> bool:
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            cached = by_target.get(target)
            if cached is None:
                cached = by_target[target] = node.is_impure(impure_random)
            return cached
        return node.is_impure(impure_random)

    return impure


def subgraph_node(graph: fx.Graph) -> str | None:
    """The first node that calls a subgraph or module (``get_attr``, ``call_module``, ``call_method``), which our
    passes leave to PyTorch's own, or None."""
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module", "call_method"):
            return f"{node.op} node {node.name} (a subgraph or module call)"
    return None


def live_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The nodes ``Graph.eliminate_dead_code`` keeps: impure ones and everything a kept node reads, in order."""
    impure = impurity_test()
    needed: set[fx.Node] = set()
    kept = []
    for node in reversed(graph.nodes):
        if node not in needed:
            if not impure(node):
                continue
        kept.append(node)
        needed.update(node.all_input_nodes)
    kept.reverse()
    return kept


@dataclass
class CleanUp:
    """What dead code elimination and CSE will do to a graph, decided without changing it: the live nodes,
    for each merged duplicate the node it merges into (both of the input graph), and each kept node's mutation
    region (None where CSE is off)."""

    graph: fx.Graph
    live: list[fx.Node]
    merged_into: dict[fx.Node, fx.Node]
    region: dict[fx.Node, int] | None

    def apply(self) -> None:
        """Do it to the graph itself: dead nodes erased, each duplicate's readers moved to the node it merges into
        and the duplicate erased, regions in ``meta["mutation_region_id"]``.  The graph then holds the nodes, names
        and order of PyTorch's cleaned-up copy; PyTorch's own dead code elimination and CSE change nothing on it, so
        its partitioner gives the same graphs from it as from the graph before."""
        live = set(self.live)
        for node in reversed(self.graph.nodes):
            if node not in live:
                self.graph.erase_node(node)  # dead: every reader is dead too and already erased (reverse order)
        for node in self.live:
            kept = self.merged_into.get(node)
            if kept is not None:
                node.replace_all_uses_with(kept)
                self.graph.erase_node(node)
            elif self.region is not None:
                node.meta["mutation_region_id"] = self.region[node]


def plan_clean_up(graph: fx.Graph, cse: bool = True) -> CleanUp:
    """Dead code elimination and CSE decided on ``graph`` (see the module docstring); ``graph`` is not modified."""
    start = time.perf_counter()
    nodes = live_nodes(graph)
    if not cse:
        return CleanUp(graph, nodes, {}, None)
    output = nodes[-1]
    if output.op != "output":
        raise AssertionError(f"expected the output node last, got {output.format_node()}")
    output_storages = {s for s in (_storage(n) for n in output.all_input_nodes) if s is not None}
    random_packets = tp.RANDOM_OP_PACKETS
    empty = EMPTY
    mutation_by_target: dict = {}
    # node -> the node standing for it: itself, or the earlier duplicate it merges into (keys compare these)
    env: dict[fx.Node, fx.Node] = {}
    merged_into: dict[fx.Node, fx.Node] = {}
    regions: dict[fx.Node, int] = {}
    seen: dict = {}  # merge key -> (kept node, its mutation region)
    region = 0
    for node in nodes:
        target = node.target
        # Inductor's rule reads the op, the target and whether an ``out=`` is given
        rule_key = (node.op, target, node.kwargs.get("out") is not None)
        is_mutation = mutation_by_target.get(rule_key)
        if is_mutation is None:
            is_mutation = mutation_by_target[rule_key] = tp.is_mutation_op(node)
        if is_mutation:
            region += 1
        aten_target = tp.aten_target(node)
        val = node.meta.get("val")
        if (
            node.op in ("placeholder", "output", "get_attr")
            or aten_target in random_packets
            or aten_target is empty
            or (output_storages and _storage(node) in output_storages)
            or (isinstance(val, sympy.Symbol) and tp.has_free_unbacked_symbols(val))
        ):
            env[node] = node
            regions[node] = region
            continue
        try:
            key = (target, _key(node.args, env), _key(node.kwargs, env))
        except _UnknownStructure:
            key = (target, _pytree_key(node.args, env), _pytree_key(node.kwargs, env))
        previous = seen.get(key)
        if previous is not None and previous[1] == region:
            env[node] = merged_into[node] = previous[0]
            continue
        env[node] = node
        regions[node] = region
        seen[key] = (node, region)
    log.debug(
        "plan_clean_up: %d nodes -> %d live, %d merged, %.4fs",
        len(graph.nodes),
        len(nodes),
        len(merged_into),
        time.perf_counter() - start,
    )
    return CleanUp(graph, nodes, merged_into, regions)


class MetaSnapshot:
    """Every node's ``meta`` as it is now, to put back (``restore``) after our passes: they mark the joint's own nodes
    (PyTorch's CSE regions and MUST_SAVE marks, our costs), and a fallback must hand PyTorch the joint's meta as it
    came.  A shallow copy of each dict, so whatever key a pass writes is undone (milliseconds at 48 blocks:
    ``benchmarks/solve_time.py``)."""

    def __init__(self, graph: fx.Graph) -> None:
        self._saved = [(node.meta, dict(node.meta)) for node in graph.nodes]

    def restore(self) -> None:
        for meta, saved in self._saved:
            meta.clear()
            meta.update(saved)


def prepare_joint_graph(joint: fx.GraphModule) -> fx.GraphModule:
    """The clean-up PyTorch's partitioner does before deciding anything (dead code out, CSE, MUST_SAVE marks:
    ``tp.mark_must_save``), done to ``joint`` itself, as PyTorch does (``CleanUp.apply``): no copy of the graph.
    Our passes then write its nodes' meta; take a ``MetaSnapshot`` first to hand a fallback the meta as it came (the
    structure a fallback gets is the cleaned one, on which PyTorch's own clean-up changes nothing).  Graphs with
    subgraphs or module calls go through PyTorch's own passes, on a copy."""
    reason = subgraph_node(joint.graph)
    if reason is not None:
        log.debug("prepare: PyTorch's dead code elimination and CSE (%s)", reason)
        prepared = tp.copy_graph_module(joint)
        tp.pytorch_dead_code_and_cse(prepared)
    else:
        # No recompile: nothing runs the joint's code, which still computes the same function (dead code and
        # duplicates only), and PyTorch's partitioner recompiles it in its own clean-up if a fallback needs it
        # (an eager recompile is 0.2 s of a 24-layer GPT-2's partition).
        plan_clean_up(joint.graph, cse=tp.cse_enabled()).apply()
        prepared = joint
    tp.mark_must_save(prepared)
    return prepared
