"""One graph of the step (forward or backward) run as Inductor schedules it: which values it stores (units), how they
fuse into kernels (``fusion.py``), and the live storages walked over the kernels' order, Inductor's buffer pool
included (``buffer_pool.py``).  The rules are ``liveness.py``'s docstring; this runs them over a ``PhaseGraph``, a
built graph's or a plan's that was never built (``plan_memory.py``).
"""

from __future__ import annotations

import torch.fx as fx

from .. import _torch_private as tp
from ..graph.costs import alias_root, hinted_numel
from ..graph.ops import CONVOLUTION, OpClass, op_class
from .access import add_loads, add_paths, another_index
from .backends import device_type_of
from .fusion import Fusion, fusion_order
from .inputs import SimulatorInputs
from .lowering import (
    KERNEL_CLASSES,
    REALIZE_READS_THRESHOLD,
    reduced_input,
    unrolled_elements,
)
from .node_facts import NodeFacts
from .phase_graph import PhaseGraph, graph_view
from .phase_reorder import peak_reordered
from .storage import FUSIBLE_VALUE, NEVER, materialises, storage_kind
from .walk import Walk

# Classes whose nodes no kernel produces (``_Phase._unit_of``).
_NO_UNIT = frozenset({OpClass.PLACEHOLDER, OpClass.OUTPUT, OpClass.VIEW, OpClass.SYMBOLIC})
_UNKNOWN = object()


def _numel(node: fx.Node) -> int:
    return hinted_numel(node.meta.get("val"))


def phase_classes(view: PhaseGraph, facts: NodeFacts) -> dict[fx.Node, OpClass]:
    """Every node's class as Inductor's code generation sees it, in this graph (its inputs are placeholders)."""
    classes = {n: OpClass.PLACEHOLDER for n in view.inputs}
    for n in view.nodes:
        if n not in classes:
            classes[n] = facts.inductor_class(n, view)
    return classes


def phase_roots(nodes: list[fx.Node], classes: dict[fx.Node, OpClass]) -> dict[fx.Node, fx.Node]:
    """``alias_root`` of every node (``nodes`` in run order, all in ``classes``), each from its source's."""
    roots: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        cls, source = classes[n], None
        if cls is OpClass.VIEW and n.args and isinstance(n.args[0], fx.Node):
            source = n.args[0]
        elif cls is OpClass.GETITEM:
            parent = n.args[0]
            parent_cls = classes[parent] if parent in classes else op_class(parent)
            if parent_cls is OpClass.VIEW and parent.args and isinstance(parent.args[0], fx.Node):
                source = parent.args[0]
        if source is None:
            roots[n] = n
        else:
            roots[n] = roots[source] if source in roots else alias_root(source, classes)
    return roots


def phase_root(node: fx.Node, view: PhaseGraph) -> fx.Node:
    """``alias_root`` within ``view``: a view of a graph input stops at that input."""
    return alias_root(node, view.input_classes)


def _unit_summary(computations: list[tuple]) -> tuple:
    """(storages read, loop sizes, storage read -> access paths) of a unit whose members' computations
    (``_Phase._computed``) are ``computations``."""
    reads = frozenset().union(*(c[0] for c in computations))
    loop = frozenset().union(*(c[1] for c in computations))
    union = frozenset().union
    return reads, loop, {r: union(*(c[3].get(r, ()) for c in computations)) for r in reads}


class _Phase:
    """One graph run as Inductor schedules it: its materialised buffers grouped into kernels (fusion), the kernels
    in an execution order, and the live storages (root node name -> bytes) walked over that order.  ``graph``: an
    FX graph or a ``PhaseGraph``."""

    def __init__(
        self,
        graph: fx.Graph | PhaseGraph,
        keep: set[str],
        carried: dict[str, int],
        gradients: frozenset = frozenset(),
        channels_last: bool = False,
        estimated_inputs: dict[str, int] | None = None,
        donated: frozenset | None = None,
        never_freed: frozenset = frozenset(),
        arrivals: dict[str, int] | None = None,
        inputs: SimulatorInputs | None = None,
    ):
        self.view = view = graph if isinstance(graph, PhaseGraph) else graph_view(graph)
        # what the simulation assumes (``inputs.py``); by default Inductor's defaults for its nodes' device
        self.inputs = inputs = inputs if inputs is not None else SimulatorInputs.default(device_type_of(view.nodes))
        self.backend = backend = inputs.backend
        self.facts = facts = view.facts or NodeFacts(backend)  # shared by the views of one joint graph's nodes
        self.nodes = view.nodes
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.classes = phase_classes(view, facts)
        self.output = view.output
        self.roots = phase_roots(self.nodes, self.classes)
        self.kinds = {
            n: NEVER if n in view.inputs else facts.storage_kind(n, self.classes, view, storage_kind)
            for n in self.nodes
        }
        # a returned view keeps its base: the base must be materialised even if it would otherwise fuse away
        self.returned = set(view.returned) | {self.roots[a] for a in view.returned}
        self.keep = keep  # root names that outlive this graph
        self.gradients = gradients  # root names that are gradients (not activations)
        self.carried = dict(carried)
        # the graph inputs Inductor's own memory estimate counts (``_pool_held``), by default what is carried in
        self.estimated_inputs = self.carried if estimated_inputs is None else estimated_inputs
        # carried storages a kernel may write over (Inductor's in-place update takes a graph input only when it is
        # donated: backward's saved tensors, never its tangents), by default all of them
        self.donated = frozenset(self.carried) if donated is None else donated
        # carried storages that outlive this graph although Inductor's estimate would free them (saved views of a
        # forward input): fxremat's compiles leave them out of the estimate (_torch_private/buffer_reuse.py)
        self.never_freed = never_freed
        # storages read here that are allocated just before their first reader, not carried in (name -> bytes): the
        # channels-last copies of saved inputs that fxremat's compile makes in backward (``layout.py``)
        self.arrivals = arrivals or {}
        self.activation_peak = 0
        self._load_orders: dict[fx.Node, list[fx.Node]] = {}  # unit -> storages in load order
        self._find_units()
        self.workspace = {u: backend.workspace_bytes(u, channels_last) for u in self.units}
        if channels_last and any(n.target is CONVOLUTION for n in self.nodes):  # Inductor lays this graph out too
            for unit in self.units:
                self.workspace[unit] += backend.depthwise_buffer_bytes(unit)
        # head -> units (graph order), and the kernels' successors, predecessors and earliest place
        self.kernels, self.kernel_succ, self.kernel_pred, self.kernel_lo = self._fused()

    def _fused(self) -> tuple:
        """Inductor's fusion of the units (``fusion.Fusion``).  It reads each unit's place, class and summary (its
        members' computations, whose keys say which reads are graph inputs): under those, the fusion of another
        plan's view of the same joint nodes (a forward often differs from another only in what outlives it) is the
        one this would make (``NodeFacts.computations``)."""
        known = self.facts.computations if self.view.facts is not None else None
        key = None
        if known is not None:
            units = ((u, self.index[u], id(self.summaries[u]), self.classes[u]) for u in self.units)
            key = ("fused", self.view.segmented, *units)
            if key in known:
                return known[key]
        fusion = Fusion(self.units, self.unit_reads, self.unit, self.index, self.access, self.view.segmented)
        vetoes = self.backend.fusion_vetoes
        kernels = fusion.fuse(self.classes, self._loop, self.facts.nbytes, lambda fusible: vetoes(self, fusible))
        found = (kernels, fusion.succ, fusion.pred, fusion.lo)
        if known is not None:
            known[key] = found
        return found

    # --- what runs: units (one per materialised buffer or multi-output op), and what each reads ---------------

    def _unit_of(self, node: fx.Node) -> fx.Node | None:
        """The node whose kernel produces ``node``'s storage, or None (placeholders, views, values fused away)."""
        cls = self.classes[node]
        if cls in _NO_UNIT:
            return None
        if cls is OpClass.GETITEM:
            parent = node.args[0]
            if self.classes.get(parent) is OpClass.VIEW:
                return None
            known = self._plain_unit.get(parent, _UNKNOWN)  # the parent comes first in graph order
            return self._unit_of(parent) if known is _UNKNOWN else known
        if cls is OpClass.MUTATION or self.facts.is_tuple(node):
            return node
        stored = materialises(node, self.classes, self.returned, self.view, self.kinds[node], self.backend)
        return node if stored else None

    def _find_units(self) -> None:
        self.unit = unit = {}
        # a built graph's facts are its own: nothing to share, so nothing kept
        known = self.facts.computations if self.view.facts is not None else None
        computed: dict[fx.Node, tuple] = {}  # node -> (reads, loop, heavy, access, loads), see ``_computed``
        # every node's ``_unit_of``, in graph order: an item's is its parent's (the loop runs for every node of every
        # plan's phases, so it asks each node once)
        self._plain_unit: dict[fx.Node, fx.Node | None] = {}
        plain, kinds = self._plain_unit, self.kinds
        computation_key, computed_of, unit_of = self._computation_key, self._computed, self._unit_of
        for node in self.nodes:
            if known is None:
                found = computed_of(node, computed)
            else:
                key = computation_key(node, computed)
                found = known.get(key)
                if found is None:
                    found = known[key] = computed_of(node, computed)
            computed[node] = found
            node_unit = plain[node] = unit_of(node)
            # ``_realized_on_reuse`` is False but for a fusible value
            if node_unit is None and kinds[node] == FUSIBLE_VALUE and self._realized_on_reuse(node, found):
                node_unit = node
            unit[node] = node_unit
        self.units = [n for n in self.nodes if unit[n] is n]
        members: dict[fx.Node, list[fx.Node]] = {u: [] for u in self.units}
        for node in self.nodes:
            if unit[node] is not None:
                members[unit[node]].append(node)
        self.members = members
        self.unit_reads, self.loop_reads, self.access, self.summaries = {}, {}, {}, {}
        for u in self.units:
            key = (u, *(id(computed[m]) for m in members[u])) if known is not None else None
            found = known.get(key) if known is not None else None
            if found is None:
                found = _unit_summary([computed[m] for m in members[u]])
                if known is not None:
                    known[key] = found
            self.summaries[u] = found
            self.unit_reads[u], self.loop_reads[u], self.access[u] = found
        # every storage a unit owns (a multi-output op owns its items')
        self.owned = {u: [m for m in members[u] if self._allocates(m)] for u in self.units}

    def _computation_key(self, node: fx.Node, computed: dict[fx.Node, tuple]) -> tuple:
        """What ``_computed`` reads of this graph for ``node``: its tensor reads, their roots, whether each root is a
        graph input or stored, and, where it is neither, that root's own computation and class.  Under this key, a
        computation made in another plan's view of the same joint nodes (``NodeFacts.computations``) is the one
        this graph would make."""
        inputs, roots, unit = self.view.inputs, self.roots, self.unit
        key = [node]
        for arg in self.facts.tensor_reads(node, self.view):
            root = roots[arg]
            if root in inputs:
                key += (arg, root, "input")
            elif unit[root] is not None:
                key += (arg, root, "unit")
            else:
                key += (arg, root, id(computed[root]), self.classes.get(root))
        return tuple(key)

    def _computed(self, node: fx.Node, computed: dict[fx.Node, tuple]) -> tuple:
        """What ``node``'s computation reads (``computed``: the nodes before it), as (the storages it reads: through
        views to their root, through fused-away values to theirs; what sizes its loop: the same, less the tables a
        fused load picks rows from (an embedding's weight), plus the fused-away values computed inside it (the rows
        picked); whether it has a costly op, fused-away producers included; storage read -> its access paths
        (``access.py``); its loads as Inductor counts them, ``access.add_loads``).  None of these is changed after."""
        facts, inputs, roots = self.facts, self.view.inputs, self.roots
        found: set[fx.Node] = set()
        loads: set[tuple] = set()
        sized: set[fx.Node] = set()
        costly, table = facts.reads(node)
        paths: dict[fx.Node, set] = {}
        cls = self.classes[node]
        fixed = cls is OpClass.REDUCTION and self.backend.reduction_loop_order_fixed and self.is_reduction(node)
        far = another_index(node) if fixed else {}
        for arg in self.view.inputs_of[node]:
            if not facts.is_tensor(arg):
                continue  # an item of a multi-output op: its kernel is the op's
            root = roots[arg]
            step = facts.access_step(arg, root)
            chain = (far[arg],) if arg in far else step  # the loop's order, where that is not the storage's
            if root in inputs or self.unit[root] is not None:
                found.add(root)
                add_paths(paths, root, (chain,))
                add_loads(loads, ((root, step, ()),))
                if arg is not table:
                    sized.add(root)
            else:
                root_reads, root_loop, root_heavy, root_access, root_loads = computed[root]
                found |= root_reads
                sized |= root_loop
                sized.add(root)
                costly = costly or root_heavy
                prefix = chain + facts.access_through(root, self.classes.get(root))
                for r, known in root_access.items():
                    add_paths(paths, r, (prefix + k for k in known))
                add_loads(loads, root_loads)
        if cls is OpClass.POINTWISE and facts.op_class(node) is OpClass.REDUCTION:
            elements = unrolled_elements(node)
            if elements > 1:
                loads, per_element = set(), loads
                add_loads(loads, per_element, elements)
        return found, sized, costly, paths, frozenset(loads)

    def _realized_on_reuse(self, node: fx.Node, computed: tuple) -> bool:
        """Inductor stores a value read by more than one node instead of computing it inside each reader when that
        computation (``computed``: ``_computed``'s) is costly: on CPU one with exp, log, sigmoid or tanh, or one with
        more than 4 reads (``StorageBox.should_realize_on_reuse``, ``config.realize_reads_threshold``), counted as
        Inductor counts them, one per storage and index (``access.add_loads``).  E.g. a SiLU backward read by both the
        expert weight's gradient and the input's: one tokens x hidden buffer; Mixtral's residual after the experts,
        ``add_6`` plus the top-2 sum of expert outputs times router weights: 3 storages, 5 reads (the sum unrolled,
        its inputs loaded at two indices each), stored (docs/DESIGN.md §6)."""
        reads, costly, loads = computed[0], computed[2], computed[4]
        if self.kinds[node] != FUSIBLE_VALUE or not self.facts.is_tensor(node):
            return False
        if len(reads) > self.backend.max_reads:
            return True  # ``has_exceeded_max_reads``: any value, read once or more (a recomputed residual stream)
        users = self.view.users(node)
        if len(users) < 2:
            return False
        if len(reads) > 1 and any(tp.realizes_inputs(u) for u in users):
            # ``GraphLowering.run_node`` (torch/_inductor/graph.py): a value with several users, one of them an op
            # that needs realized inputs (a bmm), gets ``realize_hint``, which stores it when its computation reads
            # more than one buffer (``StorageBox.realize_hint``, ir.py).  Mixtral's batched_mm experts: a gather of
            # expert weights recomputed for both the forward bmm and the input gradient (docs/DESIGN.md §6)
            return True
        return (costly and self.backend.realizes_costly_on_reuse) or len(loads) > REALIZE_READS_THRESHOLD

    def _allocates(self, node: fx.Node) -> bool:
        return self.roots[node] is node and self.facts.is_tensor(node) and self.classes[node] is not OpClass.MUTATION

    def _numel(self, unit: fx.Node) -> int:
        """The iteration space of a unit's loop: the largest tensor it writes or reads; a reduction's, the tensor it
        reduces (``lowering.reduced_input``: not the storages it reads slices of); a scatter's loop runs over the
        values it scatters (``scatter_values``), whatever the size of its output."""
        numel = self.facts.numel
        values = self.facts.loop_facts(unit)[1]
        if values is not None:
            return numel(values)
        reduced = reduced_input(unit) if self.classes[unit] is OpClass.REDUCTION else None
        if reduced is not None:
            return max((numel(n) for n in (reduced, *self.owned[unit])))
        return max((numel(n) for n in (*self.owned[unit], *self.loop_reads[unit])), default=0)

    def in_kernel_group(self, unit: fx.Node) -> bool:
        """Whether ``unit`` is a generated kernel of a backend that groups them (``SchedulingRules.
        groups_generated_kernels``: the group frees what it read when flushed), read by ``walk.Walk.grouped`` and
        ``backends/kernel_runs.py``.  A unit whose value is a tuple (a norm's backward) is not taken as one (DESIGN
        §6.0: kept from the per-node rule the seam replaced).  Inductor's output code groups one: under its
        decompositions the tuple-valued generated kernel is ``var_mean``, which its C++ backend runs in one kernel
        with its readers inside the group; here such a kernel's dead reads are freed after it, not at the group's
        flush."""
        grouped = self.backend.groups_generated_kernels and self.facts.is_tensor(unit)
        return grouped and self.classes[unit] in KERNEL_CLASSES

    def is_reduction(self, unit: fx.Node) -> bool:
        """Whether Inductor schedules the unit as a reduction (``SchedulerNode.is_reduction``): a reduction or a
        norm, not a scatter (a pointwise loop over its values, ``scatter_values``)."""
        cls = self.classes[unit]
        reduces = cls is OpClass.NORM or (cls is OpClass.REDUCTION and self.facts.loop_facts(unit)[1] is None)
        return reduces and self.facts.is_tensor(unit)

    def _loop(self, unit: fx.Node) -> tuple:
        """What must match for two units to share a kernel: the loop's size (``_numel``); for a column reduction
        (``column_reduction``) its kept and reduced sizes, which only another such reduction matches."""
        column = self.facts.loop_facts(unit)[0]
        return ("column", *column) if column is not None else ("flat", self._numel(unit))

    def fusion_order(self) -> list[fx.Node]:
        """Inductor's order after fusion (``fusion.fusion_order``), reordered for peak (``phase_reorder``)."""
        if self.view.facts is None:
            return peak_reordered(self, fusion_order(self.kernels, self.kernel_pred, self.kernel_lo))
        key = ("order", id(self.kernels))  # the kernels are ``_fused``'s, kept in ``NodeFacts.computations``
        known = self.facts.computations
        found = known.get(key) or known.setdefault(key, fusion_order(self.kernels, self.kernel_pred, self.kernel_lo))
        # the reordering also reads what outlives the graph, which inputs it may free, and the config in force
        key = (key, frozenset(self.keep), frozenset(self.returned), frozenset(self.estimated_inputs.items()))
        key += (self.inputs.reorders_for_peak,)
        reordered = known.get(key)
        if reordered is None:
            reordered = known[key] = peak_reordered(self, found)
        return reordered

    def _inplace_candidate(
        self, unit: fx.Node, nbytes: int, live: dict[str, int], remaining: dict[str, int], kernel: list[fx.Node]
    ):
        """A live input storage of the same size that no other unit will read (Inductor's in-place update, which
        also takes backward's saved inputs, freed as they die), or None.

        Inductor counts a buffer's readers per scheduler node (unit) and marks them done only after their whole
        fused kernel (``decide_inplace_update``: one remaining use, ancestors excepted): a storage that two units of
        one kernel read, neither feeding the other, is written over by neither.  E.g. a recomputed SwiGLU backward
        reads gate, up and the incoming gradient in three units of one kernel, so its three outputs are new buffers.
        ``remaining`` still counts this kernel's readers.  It takes the first such read in the order the unit's
        loop loads them (``_load_order``); when that is a buffer stored only inside this kernel (allocating
        nothing here), the result goes where that buffer went: over the live input it was itself written over
        (``Kernel.remove_kernel_local_buffers`` keeps an in-place buffer unless its whole group is removed: a loss's
        exp written over the logits, its gradient over the exp), else into a fresh buffer."""
        ancestors: set[fx.Node] | None = None
        only = self._scattered_into(unit)
        for r in self._load_order(unit):
            local = r.name not in live and self.unit.get(r) is r and r in kernel
            size = self.facts.nbytes(r) if local else live.get(r.name)
            if size != nbytes or r.name in self.keep or only not in (None, r):
                continue
            if self.facts.concat_kernel(r):  # a NopKernel's buffer is never written over (``decide_inplace_update``)
                continue
            if r.name in self.carried and r.name not in self.donated:
                continue
            if remaining[r.name] > 1 and ancestors is None:
                ancestors = self._ancestors_within(unit, kernel)
            done = sum(1 for v in ancestors or () if r in self.unit_reads[v])
            if remaining[r.name] == 1 + done:
                return self._inplace_candidate(r, nbytes, live, remaining, kernel) if local else r.name
        return None

    def _load_order(self, unit: fx.Node) -> list[fx.Node]:
        """The storages ``unit`` reads, in the order its loop first loads them: Inductor's ``decide_inplace_update``
        walks ``read_writes.reads`` in that order (``extract_loop_body_with_args`` records the loop body's loads as
        its ``inner_fn`` made them: arguments left to right, through each fused-away producer in turn).  E.g. a
        SiLU backward ``g * sigmoid(x) * (1 + x * (1 - sigmoid(x)))`` with ``sigmoid(x)`` stored: its buffer is
        loaded before ``x``, so the result is written over it, not over ``x``."""
        found = self._load_orders.get(unit)
        if found is None:
            found = self._load_orders[unit] = list(dict.fromkeys(self._loads(unit)))
        return found

    def _loads(self, unit: fx.Node):
        """Depth first, arguments left to right (a stack, not recursion: a fused chain can be long)."""
        facts, roots, inputs, stored = self.facts, self.roots, self.view.inputs, self.unit
        seen: set[fx.Node] = set()
        stack = [iter(self.view.inputs_of[unit])]
        while stack:
            arg = next(stack[-1], None)
            if arg is None:
                stack.pop()
            elif facts.is_tensor(arg):
                root = roots[arg]
                if root in inputs or stored[root] is not None:
                    yield root
                elif root not in seen:  # a fused-away value: its loads, once (a second load adds nothing new)
                    seen.add(root)
                    stack.append(iter(self.view.inputs_of[root]))

    def _scattered_into(self, unit: fx.Node):
        """For a scatter, the one input its result may be written over: the tensor it scatters into (a value that
        fuses away, such as the zeros a gradient starts from, is no storage: then none), else None for any unit.
        Inductor lowers ``index_put`` to a clone of that tensor, realized, and a ``Scatter`` that mutates the clone
        (torch/_inductor/lowering.py ``index_put`` -> ``index_put_impl_``: ``clone(x)``, ``self.realize()``,
        ``MutationLayoutSHOULDREMOVE``); ``Scheduler.decide_inplace_update`` skips a mutation's output, and only the
        clone reads anything at its write index (``SchedulerNode.can_inplace``).  So the values scattered are never
        written over: Mixtral's expert weight gradients are fresh buffers beside the saved projection they read."""
        if self.facts.loop_facts(unit)[1] is None:
            return None
        target = unit.args[0] if unit.args and isinstance(unit.args[0], fx.Node) else None
        root = self.roots.get(target) if target is not None else None
        stored = root is not None and (root in self.view.inputs or self.unit.get(root) is not None)
        if stored or root is None:
            return root if stored else unit  # the unit itself: a read it never has
        # a target that fuses away into the clone's loop (a tied head's gradient scaled in backward, DESIGN §14): the
        # clone is written over a stored input of its size, as any pointwise loop
        same = (self.roots.get(a) for a in self.view.inputs_of[root])
        return next((r for r in same if r is not None and self._stored_of_size(r, root)), unit)

    def _stored_of_size(self, node: fx.Node, like: fx.Node) -> bool:
        stored = node in self.view.inputs or self.unit.get(node) is not None
        return stored and self.facts.nbytes(node) == self.facts.nbytes(like)

    def _ancestors_within(self, unit: fx.Node, kernel: list[fx.Node]) -> set[fx.Node]:
        """The units of ``kernel`` that ``unit`` depends on (a path between two members never leaves the kernel:
        fusion makes no cycle)."""
        inside = set(kernel)
        found: set[fx.Node] = set()
        stack = [unit]
        while stack:
            for r in self.unit_reads[stack.pop()]:
                p = self.unit.get(r)
                if p in inside and p is not unit and p not in found:
                    found.add(p)
                    stack.append(p)
        return found

    def run(self, phase: str, timeline: list, order: list[fx.Node] | None = None) -> int:
        """Walk the kernels (``order``: by default Inductor's, ``fusion_order``); append (phase, unit, bytes held
        while it runs) to ``timeline``; return the phase's peak (``self.live``, ``self.activation_peak`` after)."""
        order = self.fusion_order() if order is None else order
        self.ran = (len(timeline), order)  # where its points start on the timeline, and its kernels' order
        return Walk(self, order).run(phase, timeline)

    def _reuse_key(self, unit: fx.Node, node: fx.Node):
        """The key under which Inductor's wrapper pools ``node``'s buffer for reuse (size and dtype:
        ``buffer_reuse_key``), or None: only buffers it allocates itself (its kernels' outputs, and the ``out=``
        of a matmul) are pooled; a fallback op's outputs (attention, multi-output ops) are marked unaligned and never
        match an allocation.  The size is the tensor's own: on CUDA two sizes that the allocator rounds to one
        block are still two keys (``phase_graph.allocated_bytes``)."""
        cls = self.classes[unit]
        if cls in KERNEL_CLASSES or (cls is OpClass.MATMUL and unit is node):
            return self.facts.reuse_key(node)
        return None

    def inplace_allowed(self, unit: fx.Node) -> bool:
        return self.classes[unit] in KERNEL_CLASSES and not self.facts.concat_kernel(unit)
