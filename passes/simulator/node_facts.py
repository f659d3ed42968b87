"""NodeFacts: what the step simulation (``phase.py``, ``walk.py``, ``fusion.py``) reads of a node by itself, whatever
graph holds it: its bytes and elements, whether its value is a tensor or a tuple, its op class and Inductor's
(``lowering.inductor_class``, except an ``add``'s, which may be an addmm in one graph and not in another), and the
lowering facts of one op (``column_reduction``, ``scatter_values``, ``concat_kernel``, ``HEAVY_OPS``,
``FUSED_LOADS``).  Each is computed on first demand and kept: a plan's virtual split shows the joint graph's own
nodes (``phase_graph.virtual_phase``), so one ``NodeFacts`` per joint graph (``plan_memory.JointMemory``, started
from the joint's ``graph_facts.GraphFacts``) serves every plan the peak-aware choice estimates; a built graph gets
its own.  It also keeps ``phase._Phase``'s per-node
computations, unit summaries and fusions under keys that hold all they depend on (``computations``): plans differ
in a few places (a forward mostly only in what it returns), so most of a plan's phases are found there.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..graph.costs import hinted_numel, value_nbytes
from ..graph.graph_facts import GraphFacts, Memo
from ..graph.ops import ADD as _ADD
from ..graph.ops import FUSED_LOADS, HEAVY_OPS, OpClass, op_class
from ..graph.ops import MM as _MM
from .access import layout, op_path, step
from .lowering import column_reduction, concat_kernel, inductor_class, scatter_values
from .phase_graph import PhaseGraph, storage_bytes

_MISSING = object()


def joint_tables(graph: GraphFacts, backend) -> tuple[dict[fx.Node, int], dict[fx.Node, OpClass]]:
    """(the bytes the simulator counts for every node of the joint graph: a tensor's hinted bytes as the
    ``backend``'s allocator counts them, 0 for anything else; Inductor's class of every node, read on the joint
    graph: an ``add``'s may differ in a split), derived once per graph and backend and kept with its facts
    (``GraphFacts.derived``)."""
    key = (__name__, backend.name, backend.torch_version)
    found = graph.derived.get(key)
    if found is None:
        nbytes = {}
        for node in graph.nodes:
            is_tensor = isinstance(node.meta.get("val"), torch.Tensor)
            nbytes[node] = backend.allocated_bytes(graph.nbytes[node]) if is_tensor else 0
        classes = {n: inductor_class(n, c, backend=backend) for n, c in graph.op_class.items()}
        found = graph.derived[key] = (nbytes, classes)
    return found


class NodeFacts:
    """``backend``: the ``SchedulingRules`` of the Inductor backend simulated (``backends/``), which the lowering
    facts depend on; ``graph``: the joint graph's ``GraphFacts``, whose simulated bytes and op classes (and
    Inductor's, but an ``add``'s) are these nodes' own: they start the tables rather than being computed again."""

    def __init__(self, backend, graph: GraphFacts | None = None) -> None:
        self.backend = backend
        self._nbytes: dict[fx.Node, int] = Memo(lambda node: storage_bytes(node, backend))
        self._numel: dict[fx.Node, int] = {}
        self._value: dict[fx.Node, tuple] = {}  # (is a tensor, is a tuple or list)
        self._class: dict[fx.Node, OpClass] = Memo(op_class)
        self._inductor: dict[fx.Node, OpClass] = {}
        self._reads: dict[fx.Node, tuple] = {}  # (has a costly op, the table a fused load picks rows from)
        self._loop: dict[fx.Node, object] = {}  # column_reduction, or the scatter's values (``phase._Phase._loop``)
        self._concat: dict[fx.Node, bool] = Memo(lambda node: concat_kernel(node, backend))
        self._kind: dict[fx.Node, int] = {}
        self._step: dict[tuple[fx.Node, fx.Node], tuple] = {}  # (read, its storage's root) -> ``access.step``
        self._op_path: dict[fx.Node, tuple] = Memo(op_path)  # ``access.op_path``
        # ``access.layout``: every read of a storage compares the read's layout with its root's, so a root read by
        # many nodes would compute its own layout once per read
        self._layout: dict[fx.Node, tuple] = Memo(layout)
        self._tensor_reads: dict[fx.Node, tuple] = {}  # the tensors a computed node reads (``tensor_reads``)
        self._reuse: dict[fx.Node, tuple] = {}  # (bytes, dtype): ``phase._Phase._reuse_key``
        # a node's computation and a unit's summary in a phase, under what they depend on (``phase._Phase``): kept
        # alive here, so the ``id`` of one in a key stays its own
        self.computations: dict[tuple, tuple] = {}
        if graph is not None:
            nbytes, inductor_classes = joint_tables(graph, backend)
            self._nbytes.update(nbytes)
            self._class.update(graph.op_class)
            self._inductor.update((n, c) for n, c in inductor_classes.items() if n.target is not _ADD)

    def access_step(self, arg: fx.Node, root: fx.Node) -> tuple:
        """``access.step``: a read's layout against its storage's (both fixed by the nodes' values)."""
        key = (arg, root)
        found = self._step.get(key)
        if found is None:
            found = self._step[key] = step(arg, root, self._layout.__getitem__)
        return found

    def access_through(self, node: fx.Node, cls: OpClass) -> tuple:
        """``access.through`` for a node of class ``cls`` in this phase."""
        if cls is OpClass.POINTWISE:
            return ()
        return self._op_path[node]

    def nbytes(self, node: fx.Node) -> int:
        return self._nbytes[node]

    def tensor_reads(self, node: fx.Node, graph: PhaseGraph) -> tuple:
        """The tensors ``node`` reads in ``graph``, in order: a node computed in ``graph`` reads the same in every
        graph that computes it (a split copies its arguments); a graph's inputs and its output read what that graph
        says (a value saved for backward is computed in forward and an input of backward)."""
        if node in graph.inputs or node.op == "output":
            return tuple(a for a in graph.inputs_of[node] if self.is_tensor(a))
        found = self._tensor_reads.get(node)
        if found is None:
            found = self._tensor_reads[node] = tuple(a for a in graph.inputs_of[node] if self.is_tensor(a))
        return found

    def reuse_key(self, node: fx.Node) -> tuple:
        """(the tensor's own bytes, its dtype): the key Inductor's wrapper pools its buffer under."""
        found = self._reuse.get(node)
        if found is None:
            val = node.meta["val"]
            found = self._reuse[node] = (value_nbytes(val), val.dtype)
        return found

    def numel(self, node: fx.Node) -> int:
        found = self._numel.get(node)
        if found is None:
            found = self._numel[node] = hinted_numel(node.meta.get("val"))
        return found

    def _value_facts(self, node: fx.Node) -> tuple:
        found = self._value.get(node)
        if found is None:
            val = node.meta.get("val")
            found = self._value[node] = (isinstance(val, torch.Tensor), isinstance(val, (tuple, list)))
        return found

    def is_tensor(self, node: fx.Node) -> bool:
        found = self._value.get(node)
        return (found if found is not None else self._value_facts(node))[0]

    def is_tuple(self, node: fx.Node) -> bool:
        return self._value_facts(node)[1]

    def op_class(self, node: fx.Node) -> OpClass:
        return self._class[node]

    def inductor_class(self, node: fx.Node, graph: PhaseGraph) -> OpClass:
        """``lowering.inductor_class`` in ``graph``: only an ``add`` (a possible addmm) depends on the graph."""
        found = self._inductor.get(node)
        if found is None:
            found = inductor_class(node, self.op_class(node), graph, backend=self.backend)
            if node.target is not _ADD:
                self._inductor[node] = found
        return found

    def storage_kind(self, node: fx.Node, classes: dict, graph: PhaseGraph, storage_kind) -> int:
        """``storage_kind(node, classes, graph)`` (``phase.storage_kind``) of a node computed in ``graph`` (not one
        of its inputs): it depends on the graph only for an item (its parent may be an input there), an ``mm`` (an
        addmm may fold it) and an ``add`` (which may be that addmm)."""
        found = self._kind.get(node)
        if found is None:
            found = storage_kind(node, classes, graph, backend=self.backend)
            target = node.target
            if target is not operator.getitem and target is not _MM and target is not _ADD:
                self._kind[node] = found
        return found

    def reads(self, node: fx.Node) -> tuple[bool, fx.Node | None]:
        """(whether the op is costly, ``HEAVY_OPS``; the table a fused load picks rows from, or None)."""
        found = self._reads.get(node)
        if found is None:
            packet = getattr(node.target, "overloadpacket", None)
            found = self._reads[node] = (packet in HEAVY_OPS, node.args[0] if packet in FUSED_LOADS else None)
        return found

    def loop_facts(self, node: fx.Node) -> tuple:
        """(``column_reduction``, the values a scatter loops over or None), as ``phase._Phase._loop`` reads them."""
        found = self._loop.get(node, _MISSING)
        if found is _MISSING:
            values = scatter_values(node) if self.op_class(node) is OpClass.GATHER else None
            found = self._loop[node] = (column_reduction(node), values)
        return found

    def concat_kernel(self, node: fx.Node) -> bool:
        return self._concat[node]
