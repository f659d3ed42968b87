"""PhaseGraph: what the step simulation reads of one graph (forward or backward), whether that graph was built or not.

``liveness.simulate_step`` simulates a split's real forward and backward FX graphs; ``plan_memory.estimate_peak``
simulates a plan without building them.  Both run the same simulation (``phase.py``) over this view: the nodes in
run order (graph inputs first, the output last), which of them are the graph's inputs, what each node reads and
which nodes read it *in this graph*.  A split copies the joint graph's nodes under their own names with the same
``meta``, target and arguments, so a view of the joint nodes that one split would copy, in the order it would put
them, reads exactly as the split's graph does (``virtual_phase``); its output stands in for the split's output node.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..graph.costs import value_nbytes
from ..graph.ops import OpClass

# A backward GraphModule's ``meta`` key: its forward is recomputed segment by segment (``split.SplitRecipe`` with
# backward checkpoints, ``segments.py``), and fxremat's compiles refuse horizontal fusions dragging work across
# segments (``fusion.HORIZONTAL_DRAG_FACTOR``); the simulator and Inductor's scheduler hook read it alike.
SEGMENTED_BACKWARD_KEY = "fxremat_backward_segments"


def is_segmented_backward(module) -> bool:
    """Whether ``module`` (a GraphModule, or None) is a backward recomputed segment by segment."""
    return bool(getattr(module, "meta", {}).get(SEGMENTED_BACKWARD_KEY, False))


def storage_bytes(node: fx.Node, backend) -> int:
    """The bytes the simulator counts for ``node``'s value: as the device's allocator counts them
    (``SchedulingRules.allocated_bytes`` of the ``backend`` simulated)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    return backend.allocated_bytes(value_nbytes(val))


@dataclass(eq=False)
class PhaseGraph:
    nodes: list[fx.Node]  # inputs, computed nodes in run order, then the output node
    inputs: frozenset[fx.Node]  # the graph's placeholders
    output: fx.Node
    returned: list[fx.Node]  # the nodes the output returns, in order (the output's inputs)
    returned_args: list[fx.Node]  # the output's node arguments in order, repeats included
    users_of: dict[fx.Node, list[fx.Node]]  # the nodes reading a node in this graph (the output included)
    inputs_of: dict[fx.Node, list[fx.Node]]  # what a node reads (nothing for an input)
    facts: object = None  # a ``node_facts.NodeFacts`` shared with other views of the same nodes, or None (a new one)
    segmented: bool = False  # a backward recomputed segment by segment (``SEGMENTED_BACKWARD_KEY``)

    def users(self, node: fx.Node) -> list[fx.Node]:
        return self.users_of.get(node, ())

    @functools.cached_property
    def input_classes(self) -> dict:
        """The inputs' op class (placeholders), for ``alias_root`` within this graph (``phase.phase_root``)."""
        return dict.fromkeys(self.inputs, OpClass.PLACEHOLDER)


def _items(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def graph_view(graph: fx.Graph) -> PhaseGraph:
    """The view of a built graph: nothing changes but the access."""
    nodes = list(graph.nodes)
    output = next(n for n in reversed(nodes) if n.op == "output")
    return PhaseGraph(
        nodes=nodes,
        inputs=frozenset(n for n in nodes if n.op == "placeholder"),
        output=output,
        returned=output.all_input_nodes,
        returned_args=[a for a in _items(output.args[0]) if isinstance(a, fx.Node)],
        users_of={n: list(n.users) for n in nodes},
        inputs_of={n: n.all_input_nodes for n in nodes},
        segmented=is_segmented_backward(graph.owning_module),
    )


def virtual_phase(
    inputs: list[fx.Node],
    order: list[fx.Node],
    outputs: list,
    output: fx.Node,
    inputs_of: dict[fx.Node, list[fx.Node]],
    facts: object = None,
) -> PhaseGraph:
    """The view of the graph a split would build from ``inputs``, ``order`` and ``outputs`` (joint nodes, as a
    ``split.SplitRecipe`` holds them; ``inputs_of``: every joint node's inputs), without building it.  ``output``:
    any node with ``op == "output"`` (the joint graph's), standing for this graph's output; ``facts``: the joint
    graph's ``NodeFacts``."""
    input_set = frozenset(inputs)
    returned = list(dict.fromkeys(o for o in outputs if isinstance(o, fx.Node)))
    reads: dict[fx.Node, list[fx.Node]] = {n: [] for n in inputs}
    users: dict[fx.Node, list[fx.Node]] = {n: [] for n in inputs}
    for node in order:
        reads[node] = inputs_of[node]
        users[node] = []
        for a in reads[node]:
            users[a].append(node)
    for a in returned:
        users[a].append(output)
    reads[output] = returned
    users[output] = []
    return PhaseGraph(
        nodes=[*inputs, *order, output],
        inputs=input_set,
        output=output,
        returned=returned,
        returned_args=[o for o in outputs if isinstance(o, fx.Node)],
        users_of=users,
        inputs_of=reads,
        facts=facts,
    )
