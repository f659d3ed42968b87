"""split_with_recipe: the forward and backward graphs for a chosen saved set, each built in one pass.

What comes out is node for node what PyTorch's own chain gives for the same saved set
(``_extract_fwd_bwd_modules``, then ``reordering_to_mimic_autograd_engine`` on backward, ``raise_getitems`` on both,
``thread_graphsafe_rng_from_hops``): the same placeholders and outputs in AOTAutograd's calling convention (forward
returns real outputs, saved tensors, then saved SymInts last; backward takes saved SymInts, saved tensors, then
tangents and backward seeds), the same nodes in the same order under the same names, the same ``node.meta``.
PyTorch builds six intermediate graphs and generates Python code for five GraphModules to get there; this module
decides every node's place on the joint graph's own nodes (plain sets and lists) and copies each node once.

The rules it reproduces, each from PyTorch's extraction:
* a node belongs to a subgraph if all its inputs do; placeholders only if they are the subgraph's inputs; a node
  that must run in backward (forward) is left out of forward (backward);
* dead code goes (``Graph.eliminate_dead_code``'s rule: kept if impure or read by a kept node);
* saved values that backward turns out not to read are dropped, and the SymInts that bind the symbols of the
  saved values' and tangents' shapes are added to the saved SymInts;
* saved tensors marked ``saved_tensor_with_no_vc_check`` go last among the saved tensors;
* backward is reordered the way the autograd engine would run it; getitems are raised next to their producer.

What it does not handle (``UnsupportedSplit``; the caller uses PyTorch's extraction instead): ``get_attr``,
``call_module`` and ``call_method`` nodes (higher-order ops with subgraphs, whose RNG placeholders PyTorch threads
through), ``BackwardState`` inputs, opaque saved objects (script objects), activation quantization, a forward
output that only exists in backward (PyTorch's replacement rules for triton-kernel aliases), duplicate saved values.

Tested against PyTorch's chain (generated code, placeholders, outputs, meta, results) in
``tests/robustness/test_split_vs_pytorch.py``.
"""

from __future__ import annotations

import copy
import logging
import operator
from dataclasses import dataclass

import torch.fx as fx

from .. import _torch_private as tp
from ..graph.cse import impurity_test, subgraph_node
from ..graph.graph_facts import GraphFacts, graph_facts
from ..graph.ops import COPY_INTO
from ..simulator.phase_graph import SEGMENTED_BACKWARD_KEY

log = logging.getLogger(__name__)


class UnsupportedSplit(Exception):
    """A graph feature this split does not reproduce; use PyTorch's extraction for this graph."""


def unsupported_reason(joint: fx.GraphModule) -> str | None:
    """Why this joint graph needs PyTorch's extraction, or None."""
    if tp.activation_quantization_enabled():
        return "activation quantization (activation_quantization_aten_pass) is configured"
    subgraph = subgraph_node(joint.graph)
    if subgraph is not None:
        return subgraph
    for node in joint.graph.nodes:
        if tp.is_backward_state(node):
            return f"BackwardState input {node.name}"
    return None


class _Joint:
    """What every extraction reads off the joint graph: its ``GraphFacts`` (nodes, inputs, outputs and their
    descriptors, placeholder kinds), and what the extractions keep of it, computed once."""

    def __init__(self, facts: GraphFacts) -> None:
        self.module = facts.module
        self.calls = [n for n in facts.nodes if n.op == "call_function"]
        # every node's inputs, read once (the extractions and the reordering ask tens of thousands of times)
        self.inputs_of: dict[fx.Node, list[fx.Node]] = facts.inputs_of
        self.fwd_outputs, self.bwd_outputs = facts.fwd_outputs, facts.bwd_outputs
        self.fwd_descs, self.bwd_descs = facts.fwd_descs, facts.bwd_descs
        self.primals, self.tangents = facts.primals, facts.tangents
        self.fwd_seeds, self.bwd_seeds = facts.fwd_seeds, facts.bwd_seeds
        self.backward_only: set[fx.Node] = set()  # must run in backward: never in forward
        self.forward_only: set[fx.Node] = set()  # must run in forward: never in backward
        for node in self.calls:
            if tp.must_be_in_backward(node):
                self.backward_only.add(node)
            if tp.must_be_in_forward(node):
                self.forward_only.add(node)
        self.is_impure = impurity_test()
        self._free_symbols: dict[fx.Node, object] = {}
        # the forward's inputs are the same in every split: what they reach, found once (``_extract``)
        self._forward_reach: tuple[frozenset, set, list] | None = None

    def free_symbols(self, node: fx.Node):
        """``value_free_symbols`` of a node's value, computed once (every split binds its saved values')."""
        found = self._free_symbols.get(node)
        if found is None:
            found = self._free_symbols[node] = tp.value_free_symbols(node.meta["val"])
        return found


def _extract(joint: _Joint, inputs: list[fx.Node], outputs: list, subgraph: str) -> list[fx.Node]:
    """The joint nodes (joint order, inputs excluded) of the subgraph from ``inputs`` to ``outputs``, after dead
    code elimination: ``_extract_graph_with_inputs_outputs`` without building the graph."""
    valid, candidates = _reach(joint, inputs, subgraph)
    inputs_of = joint.inputs_of
    needed = set()
    for out in outputs:
        if isinstance(out, fx.Node):
            if out not in valid:
                raise UnsupportedSplit(f"{subgraph} output {out.name} is not computable in {subgraph}")
            needed.add(out)
    kept = []
    for node in reversed(candidates):
        if node in needed or joint.is_impure(node):
            kept.append(node)
            needed.update(inputs_of[node])
    kept.reverse()
    return kept


def _reach(joint: _Joint, inputs: list[fx.Node], subgraph: str) -> tuple[set, list[fx.Node]]:
    """(the inputs and the nodes computable from them alone, those nodes in joint order): read, never changed.  A
    peak-aware choice splits tens of plans, all with one forward's inputs: that reach is kept (``_Joint``)."""
    input_set = frozenset(inputs)
    forward = subgraph == "forward"
    if forward and joint._forward_reach is not None and joint._forward_reach[0] == input_set:
        return joint._forward_reach[1], joint._forward_reach[2]
    valid = set(inputs)
    excluded = joint.backward_only if forward else joint.forward_only
    inputs_of = joint.inputs_of
    candidates = []
    for node in joint.calls:
        if node in input_set or node in excluded:
            continue
        if valid.issuperset(inputs_of[node]):
            valid.add(node)
            candidates.append(node)
    if forward:
        joint._forward_reach = (input_set, valid, candidates)
    return valid, candidates


def _input_readers(joint: _Joint, inputs: list[fx.Node], kept: list[fx.Node], outputs: list) -> dict[fx.Node, list]:
    """For each input, its readers in the extracted graph (the string "output" for the output node)."""
    input_set = set(inputs)
    readers: dict[fx.Node, list] = {n: [] for n in inputs}
    for node in kept:
        for a in joint.inputs_of[node]:
            if a in input_set:
                readers[a].append(node)
    for out in dict.fromkeys(o for o in outputs if isinstance(o, fx.Node)):
        if out in input_set:
            readers[out].append("output")
    return readers


def _drop_unread(joint: _Joint, saved_values: list, saved_sym_nodes: list) -> tuple[set, list[fx.Node]]:
    """Drop the saved values backward does not read (PyTorch's first backward extraction); (its inputs, the nodes
    it kept), for ``split_recipe`` to reuse where the second extraction has the same inputs."""
    inputs = saved_sym_nodes + saved_values + joint.tangents + joint.bwd_seeds
    kept = _extract(joint, inputs, joint.bwd_outputs, "backward")
    kept_set = set(kept)
    outputs = set(o for o in joint.bwd_outputs if isinstance(o, fx.Node))
    wait = tp.wait_tensor_target()

    def unused_wait(reader) -> bool:
        if reader == "output" or reader.target is not wait:
            return False
        return not any(u in kept_set for u in reader.users) and reader not in outputs

    unread = set()
    for node, readers in _input_readers(joint, inputs, kept, joint.bwd_outputs).items():
        if not readers or (wait is not None and all(unused_wait(r) for r in readers)):
            unread.add(node)
    saved_values[:] = [n for n in saved_values if n not in unread]
    saved_sym_nodes[:] = [n for n in saved_sym_nodes if n not in unread]
    return set(inputs), kept


def _bind_symbols(joint: _Joint, saved_values: list, saved_sym_nodes: list) -> None:
    """Saved SymInts: those binding a symbol first, then the SymInts binding every other symbol of the saved
    values' and tangents' shapes, then the derived ones (PyTorch's order)."""
    saved_symbols: set = set()
    binding, derived = [], []
    for node in saved_sym_nodes:
        symbol = tp.symbol_bound_by(node)
        if symbol:
            saved_symbols.add(symbol)
            binding.append(node)
        else:
            derived.append(node)
    bindings = None
    for node in derived + saved_values + joint.tangents:
        if "val" not in node.meta:
            continue
        free = joint.free_symbols(node)
        if not free:  # a static shape (most values): nothing to bind, no set to build
            continue
        new_symbols = free - saved_symbols
        if not new_symbols:
            continue
        if bindings is None:
            bindings = tp.find_symbol_bindings(joint.module.graph)
        for s in sorted(new_symbols, key=lambda s: s.name):
            if s in bindings:
                binding.append(bindings[s])
        saved_symbols |= new_symbols
    saved_sym_nodes[:] = binding + derived


class _Output:
    """Stands for the output node in orderings."""

    op = "output"
    target = "output"


_OUTPUT = _Output()


def _reorder_like_autograd(
    joint: _Joint, inputs: list[fx.Node], kept: list[fx.Node], output_args: list
) -> list[fx.Node] | None:
    """``reordering_to_mimic_autograd_engine`` on the extracted backward (placeholders, ``kept``, output):
    from the first reader of a tangent on, each node is placed right after whatever it still needs.  The new
    order of ``kept``, or None where PyTorch leaves the graph as it is (no node reads a tangent)."""
    output = _OUTPUT
    sequence = [*inputs, *kept, output]
    order = {n: i for i, n in enumerate(sequence)}
    tangents = set(joint.tangents)  # the joint's placeholders that are tangents (``tp.is_tangent``)
    tangent_readers = [n for n in kept if not tangents.isdisjoint(joint.inputs_of[n])]
    if not tangents.isdisjoint(a for a in output_args if isinstance(a, fx.Node)):
        tangent_readers.append(output)
    if not tangent_readers:
        return None
    first = min(order[n] for n in tangent_readers)
    placed = set(inputs)
    result: list[fx.Node] = []

    output_inputs = [a for a in output_args if isinstance(a, fx.Node)]

    def inputs_of(node):
        return output_inputs if node is output else joint.inputs_of[node]

    def place(node) -> None:
        if node in placed:
            return
        if placed.issuperset(inputs_of(node)):  # most nodes: nothing else to place first
            placed.add(node)
            if node is not output:
                result.append(node)
            return
        stack, pending = [node], set()
        while stack:
            n = stack.pop()
            if n in pending or n in placed:
                continue
            pending.add(n)
            stack += inputs_of(n)
        for n in sorted(pending, key=order.__getitem__):
            placed.add(n)
            if n is not output:
                result.append(n)

    for node in sequence[len(inputs) : first]:
        if node is not output and node.target is COPY_INTO:
            place(node)
    for node in sequence[first:]:
        place(node)
    return result


def _raise_getitems(joint: _Joint, order: list[fx.Node], placeholders: list[fx.Node]) -> list[fx.Node]:
    """``raise_getitems``: each getitem moved right after its producer, last getitem first (a linked list, so that
    nested getitems land exactly where PyTorch's in-place moves put them)."""
    getitems = [n for n in order if n.target is operator.getitem]
    if not getitems:
        return order
    head = object()
    skip = set(placeholders)
    sequence = [head, *placeholders, *order]
    nxt = {a: b for a, b in zip(sequence, sequence[1:])}
    prv = {b: a for a, b in zip(sequence, sequence[1:])}
    for node in reversed(getitems):
        parents = joint.inputs_of[node]
        if len(parents) != 1:
            raise UnsupportedSplit(f"getitem {node.name} with {len(parents)} inputs")
        parent = parents[0]
        if parent not in nxt or parent in skip:
            raise UnsupportedSplit(f"getitem {node.name} of {parent.name}, which is not a computed node")
        if nxt[parent] is node:
            continue
        # unlink node
        p, n = prv[node], nxt.get(node)
        nxt[p] = n
        if n is not None:
            prv[n] = p
        # link after parent
        after = nxt.get(parent)
        nxt[parent], prv[node] = node, parent
        nxt[node] = after
        if after is not None:
            prv[after] = node
    result, node = [], nxt[head]
    while node is not None:
        if node not in skip:
            result.append(node)
        node = nxt.get(node)
    return result


@dataclass(frozen=True)
class FirstPass:
    """An entry of a backward order: a second copy of a recomputed forward node, in the first pass that recomputes
    the backward checkpoints (``passes/rewrite/segments.py``); it reads the first-pass copies of its inputs."""

    node: fx.Node


# name suffix of first-pass copies: the other copy keeps the forward's name (describe.py matches recomputes by name)
FIRST_PASS_SUFFIX = "_first"
# meta key of a first-pass copy: the name of the joint node it copies (describe.py counts it as that node's
# recomputation where the backward holds no other copy: a checkpoint the main pass reads from the first pass)
FIRST_PASS_OF = "fxremat_first_pass_of"


def _build(
    inputs: list[fx.Node],
    order: list,
    outputs: list,
    descs: list,
    *,
    copy_input_meta: bool,
    mark_backward: bool,
    checkpoints: frozenset[fx.Node] = frozenset(),
) -> fx.Graph:
    """The graph of ``order`` (joint nodes and ``FirstPass`` entries); every read of a node in ``checkpoints``
    reads its first-pass copy."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    first: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = copy.copy(node.meta) if copy_input_meta else node.meta
        env[node] = placeholder

    def lookup(node: fx.Node) -> fx.Node:
        return first[node] if node in checkpoints else env[node]

    def first_lookup(node: fx.Node) -> fx.Node:
        return first[node] if node in first else env[node]

    for item in order:
        if type(item) is FirstPass:
            new = tp.copy_node(graph, item.node, first_lookup, item.node.name + FIRST_PASS_SUFFIX)
            new.meta[FIRST_PASS_OF] = item.node.name  # copy_node's meta is the copy's own (a shallow copy)
            first[item.node] = new
        else:
            new = tp.copy_node(graph, item, lookup)
            env[item] = new
        if mark_backward:
            new.meta["autograd_backward"] = True
    values = [lookup(x) if isinstance(x, fx.Node) else x for x in outputs]
    out = graph.output(tuple(values))
    out.meta["desc"] = descs
    if tp.OPAQUE_NODES_AND_OUTPUT_TRACES:  # PyTorch's extraction snapshots them from 2.12 on
        traces = [v.meta.get("stack_trace") if isinstance(v, fx.Node) else None for v in values]
        out.meta["output_stack_traces"] = traces
    return graph


@dataclass(frozen=True)
class SplitRecipe:
    """Every decision of a split, as joint nodes in order: ``build()`` makes the forward and backward graphs from
    it, and makes them again, identical, whenever asked (the report's memory simulation builds its own pair
    later: the first pair belongs to Inductor, which rewrites it in place)."""

    joint: fx.GraphModule
    fw_inputs: list[fx.Node]
    fw_order: list[fx.Node]
    fw_outputs: list
    fw_descs: list
    bw_inputs: list[fx.Node]
    bw_order: list[fx.Node]
    bw_outputs: list
    bw_descs: list
    bw_copy_input_meta: bool  # PyTorch's backward reordering copies its placeholders' meta
    # backward checkpoints (passes/rewrite/segments.py): bw_order then holds FirstPass entries, and every backward
    # read of one of these nodes reads its first-pass copy
    bw_checkpoints: frozenset[fx.Node] = frozenset()

    def build(self, lazy: bool = False) -> tuple[fx.GraphModule, fx.GraphModule]:
        """The (forward, backward) GraphModules; ``lazy``: modules whose Python code is never generated unless
        used, for a caller that only reads the graphs."""
        return self.build_forward(lazy), self.build_backward(lazy)

    def build_forward(self, lazy: bool = False) -> fx.GraphModule:
        graph = _build(
            self.fw_inputs, self.fw_order, self.fw_outputs, self.fw_descs, copy_input_meta=False, mark_backward=False
        )
        return (tp.lazy_graph_module if lazy else tp.make_graph_module)(self.joint, graph)

    def build_backward(self, lazy: bool = False) -> fx.GraphModule:
        """The backward alone: a split's segmentations (``segments.py``) share its forward."""
        parts = (self.bw_inputs, self.bw_order, self.bw_outputs, self.bw_descs)
        marked, meta = tp.BACKWARD_OPS_MARKED, self.bw_copy_input_meta
        graph = _build(*parts, copy_input_meta=meta, mark_backward=marked, checkpoints=self.bw_checkpoints)
        module = (tp.lazy_graph_module if lazy else tp.make_graph_module)(self.joint, graph)
        if self.bw_checkpoints:  # read by the simulator and by fxremat's compiles alike (fusion.py)
            module.meta[SEGMENTED_BACKWARD_KEY] = True
        return module


def joint_facts(joint: fx.GraphModule, num_fwd_outputs: int) -> _Joint:
    """What every split of ``joint`` reads off it, made once per ``GraphFacts`` (``graph_facts.graph_facts``: the
    partition's splits share it); raises ``UnsupportedSplit`` for a graph this module does not split."""
    facts = graph_facts(joint, num_fwd_outputs)
    if facts.split is None:
        reason = unsupported_reason(joint)
        if reason is not None:
            raise UnsupportedSplit(reason)
        facts.split = _Joint(facts)
    return facts.split


def split_recipe(
    joint: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    facts: _Joint | None = None,
) -> SplitRecipe:
    """Where every node of the forward and backward graphs comes from, for this saved set (see the module
    docstring); raises ``UnsupportedSplit`` for what it does not reproduce.  ``facts``: ``joint_facts(joint,
    num_fwd_outputs)``, for a caller that splits one joint graph many times (``plan_memory.py``)."""
    if facts is None:
        facts = joint_facts(joint, num_fwd_outputs)
    saved_values, saved_sym_nodes = list(saved_values), list(saved_sym_nodes)
    if len(set(saved_values + saved_sym_nodes)) != len(saved_values) + len(saved_sym_nodes):
        raise UnsupportedSplit("a value is saved twice")
    for node in saved_values:
        if tp.is_script_object(node):
            raise UnsupportedSplit(f"opaque saved object {node.name}")
    j = facts

    first_inputs, first_kept = _drop_unread(j, saved_values, saved_sym_nodes)
    _bind_symbols(j, saved_values, saved_sym_nodes)
    checked = [n for n in saved_values if not n.meta.get("saved_tensor_with_no_vc_check", False)]
    unchecked = [n for n in saved_values if n.meta.get("saved_tensor_with_no_vc_check", False)]
    saved_values = checked + unchecked

    fw_inputs = j.primals + j.fwd_seeds
    fw_outputs = j.fwd_outputs + saved_values + saved_sym_nodes
    fw_descs = j.fwd_descs + tp.saved_output_descs(len(saved_values), len(checked), len(saved_sym_nodes))
    fw_order = _raise_getitems(j, _extract(j, fw_inputs, fw_outputs, "forward"), fw_inputs)

    bw_inputs = saved_sym_nodes + saved_values + j.tangents + j.bwd_seeds
    # an extraction depends on its inputs as a set: the first one's result stands when nothing was dropped or added
    same = first_inputs == set(bw_inputs)
    bw_kept = first_kept if same else _extract(j, bw_inputs, j.bwd_outputs, "backward")
    reordered = _reorder_like_autograd(j, bw_inputs, bw_kept, j.bwd_outputs)
    bw_order = _raise_getitems(j, reordered if reordered is not None else bw_kept, bw_inputs)
    return SplitRecipe(
        joint,
        fw_inputs,
        fw_order,
        fw_outputs,
        fw_descs,
        bw_inputs,
        bw_order,
        j.bwd_outputs,
        j.bwd_descs,
        bw_copy_input_meta=reordered is not None,
    )


def split_with_recipe(
    joint: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes,
) -> tuple[fx.GraphModule, fx.GraphModule, SplitRecipe | None]:
    """Forward and backward GraphModules for this saved set (see the module docstring) and the recipe that built
    them, or PyTorch's own chain for the graphs it does not handle (``UnsupportedSplit``), with no recipe."""
    try:
        recipe = split_recipe(joint, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs)
    except UnsupportedSplit as why:
        log.debug("split: PyTorch's extraction for this graph (%s)", why)
    else:
        return (*recipe.build(), recipe)
    fw, bw = tp.split_with_saved_values(
        joint,
        list(saved_values),
        list(saved_sym_nodes),
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=static_lifetime_input_nodes,
    )
    return fw, bw, None
