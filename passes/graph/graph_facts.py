"""GraphFacts: one view of a prepared joint graph, read by every pass.

What each pass used to read off the joint graph by itself (``roles.classify``, ``costs.annotate_costs``,
``split._Joint``, ``plan_memory.build_joint_memory``, the simulator's ``node_facts.NodeFacts``), computed once after
``cse.prepare_joint_graph`` and ``phase_copies.copy_gathers_per_phase``: the nodes in graph order and their index,
every node's inputs and users, the placeholder kinds (AOTAutograd's own predicates, ``_torch_private``), the forward
and backward outputs (the output node split at ``num_fwd_outputs``), every node's op class (``ops.op_class``) and,
on first demand, its alias root (``costs.alias_root``) and its hinted bytes (``costs.value_nbytes``).  The passes
work on these and on plain arrays, as the solver tier does.  What a later stage derives from the facts once per
graph (the simulator's Inductor classes and allocated bytes, ``simulator/node_facts.py``) it keeps in ``derived``,
under its own key: the facts themselves never depend on a later stage.

``fxremat/partition.py`` builds the facts of the graph it partitions and keeps them on the graph (``attach``): it
changes no node after that, so a pass that gets only the graph (``split.split_with_recipe``) finds them there
(``graph_facts``).  Any other graph (a test's, a benchmark's) gets facts built for the call, as before.
"""

from __future__ import annotations

import functools

import torch.fx as fx

from .. import _torch_private as tp
from .costs import node_nbytes
from .ops import OpClass, op_class

# the attribute of an ``fx.Graph`` holding its facts (a GraphModule's ``meta`` is deep-copied with it; a Graph's own
# attributes are not: a copy of the graph never carries stale facts)
_ATTRIBUTE = "_fxremat_graph_facts"


class Memo(dict):
    """A per-node fact computed on its first lookup and kept (a hit is one dict lookup, which hot paths need)."""

    def __init__(self, compute) -> None:
        super().__init__()
        self.compute = compute

    def __missing__(self, key):
        found = self[key] = self.compute(key)
        return found


class GraphFacts:
    """The facts of one joint graph (see the module's docstring); read only, once built."""

    def __init__(self, joint: fx.GraphModule, num_fwd_outputs: int) -> None:
        self.module = joint
        self.graph = joint.graph
        self.num_fwd_outputs = num_fwd_outputs
        self.nodes: tuple[fx.Node, ...] = tuple(joint.graph.nodes)
        self.index: dict[fx.Node, int] = {n: i for i, n in enumerate(self.nodes)}
        # read once: each call of ``all_input_nodes`` builds a new list, and the passes ask tens of thousands of times
        self.inputs_of: dict[fx.Node, list[fx.Node]] = {n: n.all_input_nodes for n in self.nodes}
        self.output = next(n for n in reversed(self.nodes) if n.op == "output")
        self.fwd_outputs, self.bwd_outputs, self.fwd_descs, self.bwd_descs = tp.extract_fwd_bwd_outputs_and_descs(
            joint, num_fwd_outputs
        )
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.primals = [n for n in placeholders if tp.is_primal(n)]
        self.tangents = [n for n in placeholders if tp.is_tangent(n)]
        self.fwd_seeds = [n for n in placeholders if tp.is_fwd_seed_offset(n)]
        self.bwd_seeds = [n for n in placeholders if tp.is_bwd_seed_offset(n)]
        self.backward_inputs = frozenset(self.tangents + self.bwd_seeds)  # backward's own inputs; the rest forward's
        self.op_class: dict[fx.Node, OpClass] = {n: op_class(n) for n in self.nodes}
        self.nbytes: dict[fx.Node, int] = Memo(node_nbytes)  # ``costs.value_nbytes`` of a node's value (hinted)
        self.split = None  # ``split._Joint`` of this graph, made by the first split that needs it
        self.derived: dict[str, object] = {}  # what a later stage derives from these facts, under its key

    @functools.cached_property
    def users_of(self) -> dict[fx.Node, tuple[fx.Node, ...]]:
        return {n: tuple(n.users) for n in self.nodes}

    @functools.cached_property
    def alias_root(self) -> dict[fx.Node, fx.Node]:
        """``costs.alias_root`` of every node, each from its source's (graph order puts the source first)."""
        classes = self.op_class
        roots: dict[fx.Node, fx.Node] = {}
        for node in self.nodes:
            cls, source = classes[node], None
            if cls is OpClass.VIEW and node.args and isinstance(node.args[0], fx.Node):
                source = node.args[0]
            elif cls is OpClass.GETITEM:
                parent = node.args[0]
                if classes[parent] is OpClass.VIEW and parent.args and isinstance(parent.args[0], fx.Node):
                    source = parent.args[0]
            roots[node] = node if source is None else roots[source]
        return roots

    def is_current(self, graph: fx.Graph, num_fwd_outputs: int | None = None) -> bool:
        """Whether these are ``graph``'s facts and the graph still has the nodes they were built from."""
        return (
            graph is self.graph
            and (num_fwd_outputs is None or num_fwd_outputs == self.num_fwd_outputs)
            and len(graph.nodes) == len(self.nodes)
            and graph.output_node() is self.output
        )


def readers_through_views(node: fx.Node, classes: dict | None = None, users=None) -> set[fx.Node]:
    """The nodes that read ``node``'s data, looking through views of it (a view fuses nothing by itself).
    ``classes``: the op classes to read (``ops.op_class`` where None); ``users(node)``: a node's readers in the
    graph at hand (its own ``users`` where None)."""
    class_of = classes.get if classes is not None else op_class
    users_of = users if users is not None else (lambda n: n.users)
    readers: set[fx.Node] = set()
    stack = list(users_of(node))
    while stack:
        user = stack.pop()
        if class_of(user) in (OpClass.VIEW, OpClass.GETITEM):
            stack.extend(users_of(user))
        else:
            readers.add(user)
    return readers


def attach(joint: fx.GraphModule, num_fwd_outputs: int) -> GraphFacts:
    """The facts of ``joint``, built now and kept on its graph for every later pass of this partition."""
    facts = GraphFacts(joint, num_fwd_outputs)
    setattr(joint.graph, _ATTRIBUTE, facts)
    return facts


def attached(graph: fx.Graph, num_fwd_outputs: int | None = None) -> GraphFacts | None:
    """The facts ``attach`` kept on ``graph``, if they are still its own (else None)."""
    facts = getattr(graph, _ATTRIBUTE, None)
    return facts if facts is not None and facts.is_current(graph, num_fwd_outputs) else None


def graph_facts(joint: fx.GraphModule, num_fwd_outputs: int) -> GraphFacts:
    """The facts of ``joint``: those ``attach`` kept, or new ones for this caller alone."""
    found = attached(joint.graph, num_fwd_outputs)
    return found if found is not None else GraphFacts(joint, num_fwd_outputs)
