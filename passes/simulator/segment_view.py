"""The view of a segmented backward (``rewrite/segments.py``: a ``split.SplitRecipe`` with backward checkpoints)
that its ``build_backward`` would make, without building it: what ``phase_graph.virtual_phase`` is to an unsegmented
one.

A built segmented backward holds a copy of every node; the simulation reads a node's arguments (a view's source,
an item's parent) as well as the graph's edges, so a view must show, for each node, one whose arguments are the
nodes the built graph's copy reads.  A joint node whose inputs all read as themselves is shown as itself, as
``virtual_phase`` shows it; a first-pass copy (``split.FirstPass``), and a node reading a checkpoint or another node
shown by a stand-in, is shown by a stand-in: a copy of the joint node with its arguments so mapped, under the name
the built graph gives it (``_torch_private.detached_copy``: no graph holds it, and the joint graph's nodes do not
count it among their users).  Stand-ins are made once per (node, name, the inputs it reads) and kept
(``ShadowNodes``): the segmentations of every plan of one joint graph show the same objects where they read the
same, so the joint graph's ``NodeFacts`` and the computations kept in it serve them all.  Same simulation as the
built graph's (tests/passes/test_segments.py).
"""

from __future__ import annotations

import operator
from dataclasses import replace

import torch.fx as fx

from .. import _torch_private as tp
from ..rewrite.split import FIRST_PASS_SUFFIX, FirstPass
from .phase_graph import PhaseGraph, virtual_phase


class ShadowNodes:
    """The stand-ins of one joint graph's segmented backwards, by (joint node, name, the nodes it reads)."""

    def __init__(self) -> None:
        self.graph = fx.Graph()  # owns the stand-ins; holds none of them
        self.made: dict[tuple, fx.Node] = {}

    def shown(self, node: fx.Node, lookup, name: str, inputs: list[fx.Node]) -> fx.Node:
        """``node`` with its inputs read through ``lookup`` (``inputs``: its inputs), named ``name``: itself where
        that changes nothing."""
        read = tuple(map(lookup, inputs))
        if name == node.name and all(map(operator.is_, read, inputs)):
            return node
        key = (node, name, read)
        found = self.made.get(key)
        if found is None:
            found = self.made[key] = tp.detached_copy(self.graph, node, lookup, name)
        return found


def backward_view(recipe, shadows: ShadowNodes, output: fx.Node, inputs_of, facts) -> PhaseGraph:
    """The view of ``recipe.build_backward()`` (``split.SplitRecipe``, segmented or not): ``split._build``'s
    mapping, every read of a checkpoint reading its first-pass copy, each first-pass copy reading the first-pass
    copies of its inputs.  ``output``, ``inputs_of``, ``facts``: as ``phase_graph.virtual_phase`` takes them."""
    checkpoints = recipe.bw_checkpoints
    env: dict[fx.Node, fx.Node] = {}
    first: dict[fx.Node, fx.Node] = {}

    def lookup(node: fx.Node) -> fx.Node:
        return first[node] if node in checkpoints else env.get(node, node)

    def first_lookup(node: fx.Node) -> fx.Node:
        return first[node] if node in first else env.get(node, node)

    order, reads = [], {}
    for item in recipe.bw_order:
        if type(item) is FirstPass:
            node = item.node
            shown = first[node] = shadows.shown(node, first_lookup, node.name + FIRST_PASS_SUFFIX, inputs_of[node])
        else:
            shown = env[item] = shadows.shown(item, lookup, item.name, inputs_of[item])
        order.append(shown)
        reads[shown] = inputs_of[shown] if shown in inputs_of else shown.all_input_nodes
    outputs = [lookup(o) if isinstance(o, fx.Node) else o for o in recipe.bw_outputs]
    view = virtual_phase(recipe.bw_inputs, order, outputs, output, reads, facts)
    return replace(view, segmented=bool(checkpoints))
