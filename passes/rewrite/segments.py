"""Backward checkpoints: recompute the forward segment by segment inside backward (docs/DESIGN.md §5.4).

A plan that saves nothing has backward recompute the whole forward, and backward recomputes lazily
(``split._reorder_like_autograd``): its first node needs the last layer, so the whole forward is recomputed at
once and held, the peak of keeping everything.  ``passes/solver/checkpoints.py`` fixes that in forward, by keeping
waists; this module does it inside backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", applied
to
the recomputation itself), so that it applies to any plan, the one that saves nothing included:

* checkpoints S_1..S_k are open sets of the recomputed region (``checkpoints.forward_waists`` on the forward nodes
  that backward recomputes): separators, so everything after S_j reads what came before only through S_j;
* a first pass at the start of backward recomputes S_1, then S_2 from S_1, ... (``split.FirstPass`` copies of the
  recomputed nodes up to S_k; their intermediates die at once, only the S_j stay);
* every backward read of a checkpoint reads its first-pass copy, so the original recomputation is cut at each
  checkpoint and the lazy order rebuilds segment j+1 from S_j just before its gradients need it.

Nodes before S_k are computed twice in backward (``segment_recompute_flops``).  Only nodes the plan already
recomputes are copied, so random ops (never recomputed, ``roles.py``) are never copied either.

``segment_backward(recipe)`` returns a new ``SplitRecipe``; its ``build()`` makes the segmented graphs, every time.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

from .. import _torch_private as tp
from ..graph.costs import DeviceProfile, alias_root, node_cost, node_nbytes
from ..graph.cse import impurity_test
from ..graph.graph_facts import attached
from ..graph.ops import NEVER_RECOMPUTE, OpClass, op_class
from ..simulator.backends import backend_for_device, device_type_of_graph
from ..simulator.layout import has_convolution
from ..simulator.liveness import PeakEstimate, forward_run, simulate_backwards
from ..simulator.lowering import inductor_class, readers_in
from ..simulator.plan_memory import backward_view, forward_simulation, forward_view
from ..simulator.rules import SchedulingRules
from ..simulator.storage import materialises
from ..solver.checkpoints import SEGMENT_COUNTS, Waists, forward_waists, segment_checkpoints
from .split import FirstPass, SplitRecipe

log = logging.getLogger(__name__)


class _JointReads:
    """What this pass reads of a recipe's joint graph: the ``GraphFacts`` the partition attached to it
    (``passes/graph/graph_facts.py``: inputs, alias roots, op classes, bytes and order, read once), or, for a recipe
    made elsewhere (a test's, a benchmark's), each node read by itself."""

    def __init__(self, recipe: SplitRecipe, backend: SchedulingRules | None = None) -> None:
        # the rules of the backend that compiles the joint graph's splits: the simulator's explicit input where the
        # caller has one (``SimulatorInputs.backend``), else the joint graph's device's (``simulator/backends``)
        self.backend = backend or backend_for_device(device_type_of_graph(recipe.joint))
        facts = attached(recipe.joint.graph)
        if facts is not None:
            self.inputs, self.root = facts.inputs_of.__getitem__, facts.alias_root.__getitem__
            self.op_class, self.nbytes, self.index = facts.op_class.__getitem__, facts.nbytes.__getitem__, facts.index
        else:
            self.inputs, self.root = (lambda node: node.all_input_nodes), alias_root
            self.op_class, self.nbytes = op_class, node_nbytes
            self.index = {n: i for i, n in enumerate(recipe.joint.graph.nodes)}


def recomputed_region(recipe: SplitRecipe, reads: _JointReads | None = None) -> list[fx.Node]:
    """The forward nodes backward recomputes (ancestors of forward's outputs in the joint graph), in joint order."""
    inputs = (reads or _JointReads(recipe)).inputs
    forward: set[fx.Node] = set()
    stack = [o for o in recipe.fw_outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in forward:
            forward.add(node)
            stack += inputs(node)
    return [n for n in recipe.bw_order if type(n) is fx.Node and n in forward and n.op == "call_function"]


@dataclass(frozen=True)
class _Region:
    """The recomputed region as ``forward_waists`` reads a problem: values, edges, storages (views share their
    base's; storages of graph inputs and saved values are -1: they are held anyway)."""

    nodes: list[fx.Node]
    num_values: int
    edges: list[tuple[int, int]]
    storage: list[int]
    storage_bytes: list[int]
    fused: frozenset[fx.Node] = frozenset()  # gathers that hold no storage (``_fused_into_reductions``)


class _InductorClasses(dict):
    """Each joint node's class as Inductor's code generation sees it (``lowering.inductor_class``, outside any
    phase: an ``add`` is not taken for an addmm), computed on first look."""

    def __init__(self, reads: _JointReads) -> None:
        super().__init__()
        self.reads = reads

    def __missing__(self, node: fx.Node):
        found = self[node] = inductor_class(node, self.reads.op_class(node), backend=self.reads.backend)
        return found

    def get(self, node, default=None):
        return self[node] if isinstance(node, fx.Node) else default


def _fused_into_reductions(node: fx.Node, classes: _InductorClasses, reads: _JointReads) -> bool:
    """Whether ``node`` is a gather that Inductor never stores because only reductions read it, each loading it
    element by element (``phase.materialises``): a MoE layer's gather of each token's expert weights, read by a
    one-column ``bmm`` that Inductor lowers to a reduction on CPU (``lowering.inductor_class``).  Counted at their
    shape's size (large, against nothing held) they would set every segment's size.  Only these: counting every
    fusible value as free (embedding lookups, pointwise values, which are stored once they are checkpoints) moves
    other models' segmentations to higher peaks or more recompute (docs/DESIGN.md §5.4)."""
    if reads.op_class(node) is not OpClass.GATHER or materialises(node, classes, set(), backend=reads.backend):
        return False
    return all(classes[u] is OpClass.REDUCTION for u in readers_in(node, classes))


def _region(nodes: list[fx.Node], reads: _JointReads) -> _Region:
    """The region's values, edges and storages (``_fused_into_reductions``: a gather that holds none)."""
    index = {n: i for i, n in enumerate(nodes)}
    edges = [(index[a], index[n]) for n in nodes for a in reads.inputs(n) if a in index]
    storage, storage_bytes, storage_of, fused = [], [], {}, set()
    classes = _InductorClasses(reads)
    for node in nodes:
        root = reads.root(node)
        if root.target is operator.getitem and root.args[0] in index:
            root = root.args[0]  # an item of a multi-output node: held with the node, whose bytes are its items'
        if root not in index or not isinstance(root.meta.get("val"), (torch.Tensor, tuple, list)):
            storage.append(-1)
            continue
        if _fused_into_reductions(root, classes, reads):
            fused.add(root)
            storage.append(-1)
            continue
        if root not in storage_of:
            storage_of[root] = len(storage_bytes)
            storage_bytes.append(reads.nbytes(root))
        storage.append(storage_of[root])
    return _Region(nodes, len(nodes), edges, storage, storage_bytes, frozenset(fused))


def _checkpoint_set(region: _Region, members: Sequence[int], reads: _JointReads) -> tuple[fx.Node, ...]:
    """The nodes of an open set, each gather its readers fuse replaced by its own inputs in the region: carried
    from the first pass to a later segment it would have two readers, one of them a ``bmm``, and Inductor stores a
    gather read that way (``phase._Phase._realized_on_reuse``; Mixtral's expert weights, docs/DESIGN.md §5.4).
    Recomputed in its segment from the index it gathers by, it is read once there and never stored."""
    inside, result = set(region.nodes), []
    for v in members:
        node = region.nodes[v]
        for kept in [a for a in reads.inputs(node) if a in inside] if node in region.fused else [node]:
            if kept not in result:
                result.append(kept)
    return tuple(result)


def _estimate(region: _Region, waists: Waists, chosen: Sequence[int]) -> int:
    """Bytes held while backward runs its largest segment: every checkpoint's storages plus that segment's."""
    storages = {region.storage[v] for j in chosen for v in waists.open_sets[j] if region.storage[v] >= 0}
    held = sum(region.storage_bytes[k] for k in storages)
    bounds = [0, *(waists.cumulative_bytes[j] for j in chosen), waists.cumulative_bytes[-1]]
    return held + max(b - a for a, b in zip(bounds, bounds[1:]))


def checkpoint_grid(
    recipe: SplitRecipe, backend: SchedulingRules | None = None
) -> list[tuple[int, tuple[tuple[fx.Node, ...], ...]]]:
    """(estimated backward bytes, checkpoint sets) for each segment count of ``checkpoints.SEGMENT_COUNTS`` with a
    distinct set; a checkpoint set is an open set of the recomputed region, and the sets are in forward order.  The
    estimate is every checkpoint's storages plus the largest segment's bytes.  Empty where backward recomputes
    nothing worth cutting, or something that may not be copied (a random op).  ``backend``: the rules of the
    backend that compiles the splits (default: the joint graph's device's)."""
    reads = _JointReads(recipe, backend)
    nodes = recomputed_region(recipe, reads)
    if not nodes or any(reads.op_class(n) in NEVER_RECOMPUTE for n in nodes):
        return []
    region = _region(nodes, reads)
    waists = forward_waists(region, [True] * len(nodes))
    total = waists.cumulative_bytes[-1]
    grid, seen = [], set()
    for count in SEGMENT_COUNTS if total else ():
        chosen = tuple(j for j in segment_checkpoints(waists, max(1, total // count)) if waists.open_sets[j])
        if chosen and chosen not in seen:
            seen.add(chosen)
            sets = tuple(_checkpoint_set(region, waists.open_sets[j], reads) for j in chosen)
            grid.append((_estimate(region, waists, chosen), sets))
    return grid


def backward_checkpoints(recipe: SplitRecipe) -> tuple[tuple[fx.Node, ...], ...]:
    """The checkpoint sets of ``checkpoint_grid`` with the lowest estimate (none if none is below the whole
    recomputed region's bytes)."""
    grid = checkpoint_grid(recipe)
    return min(grid, key=lambda entry: entry[0])[1] if grid else ()


def _live_main(recipe: SplitRecipe, checkpoints: frozenset[fx.Node], reads: _JointReads) -> set[fx.Node]:
    """Backward's own copies still read once checkpoints are read from the first pass."""
    order = set(recipe.bw_order)
    impure = impurity_test()
    live: set[fx.Node] = set()
    stack = [o for o in recipe.bw_outputs if isinstance(o, fx.Node)] + [n for n in recipe.bw_order if impure(n)]
    while stack:
        node = stack.pop()
        if node in live or node in checkpoints or node not in order:
            continue
        live.add(node)
        stack += reads.inputs(node)
    return live


def _first_pass(region: list[fx.Node], checkpoints: frozenset[fx.Node], reads: _JointReads) -> list[fx.Node]:
    """The recomputed nodes the first pass copies: the checkpoints and their ancestors in the region."""
    inside = set(region)
    needed: set[fx.Node] = set()
    stack = list(checkpoints)
    while stack:
        node = stack.pop()
        if node not in needed and node in inside:
            needed.add(node)
            stack += reads.inputs(node)
    return [n for n in region if n in needed]


def _lazy_order(recipe: SplitRecipe, main: list[fx.Node], first: list[fx.Node], checkpoints: frozenset, reads) -> list:
    """``split._reorder_like_autograd`` on the segmented backward: from the first reader of a tangent on, each
    node (in joint order) is placed right after whatever it still needs, first-pass copies included."""
    first_set, index, inputs = set(first), reads.index, reads.inputs

    def inputs_of(item) -> list:
        if type(item) is FirstPass:
            return [FirstPass(a) if a in first_set else a for a in inputs(item.node)]
        return [FirstPass(a) if a in checkpoints else a for a in inputs(item)]

    def key(item) -> tuple[int, int]:
        return (index[item.node], 0) if type(item) is FirstPass else (index[item], 1)

    tangents = {n for n in recipe.bw_inputs if tp.is_tangent(n)}
    main = sorted(main, key=index.__getitem__)
    readers = [i for i, n in enumerate(main) if not tangents.isdisjoint(inputs(n))]
    placed: set = set(recipe.bw_inputs)
    result: list = []

    def place(item) -> None:
        stack, pending = [item], set()
        while stack:
            n = stack.pop()
            if n not in pending and n not in placed:
                pending.add(n)
                stack += inputs_of(n)
        for n in sorted(pending, key=key):
            placed.add(n)
            result.append(n)

    for node in main[readers[0] if readers else 0 :]:
        if node not in placed:
            place(node)
    for node in main:  # what the output reads, and impure nodes read by none
        if node not in placed:
            place(node)
    return _raise_getitems(result, checkpoints)


def _raise_getitems(order: list, checkpoints: frozenset) -> list:
    """Each getitem right after its producer (``split._raise_getitems``' rule, here for first-pass entries too)."""
    children: dict = {}
    for item in order:
        node = item.node if type(item) is FirstPass else item
        if node.target is operator.getitem:
            parent = node.args[0]
            first = type(item) is FirstPass or parent in checkpoints
            children.setdefault(FirstPass(parent) if first else parent, []).append(item)
    result: list = []

    def emit(item) -> None:
        result.append(item)
        for child in children.get(item, ()):
            emit(child)

    getitems = {c for cs in children.values() for c in cs}
    for item in order:
        if item not in getitems:
            emit(item)
    return result


def segment_backward(
    recipe: SplitRecipe,
    checkpoint_sets: Sequence[Sequence[fx.Node]] | None = None,
    backend: SchedulingRules | None = None,
) -> SplitRecipe:
    """The recipe whose backward recomputes the forward segment by segment from ``checkpoint_sets`` (default:
    ``backward_checkpoints``; module docstring); the recipe itself where there is nothing to cut (no recomputation,
    or a mutation in backward)."""
    if recipe.bw_checkpoints:
        return recipe  # segmented already
    if checkpoint_sets is None:
        checkpoint_sets = backward_checkpoints(recipe)
    if not checkpoint_sets or any(tp.is_mutation_op(n) for n in recipe.bw_order):
        return recipe
    checkpoints = frozenset(n for s in checkpoint_sets for n in s)
    reads = _JointReads(recipe, backend)
    region = recomputed_region(recipe, reads)
    live = _live_main(recipe, checkpoints, reads)
    main = [n for n in recipe.bw_order if n in live]
    first = _first_pass(region, checkpoints, reads)
    order = _lazy_order(recipe, main, first, checkpoints, reads)
    log.debug(
        "segments: %d checkpoint sets (%d nodes), %d first-pass copies, %d backward nodes",
        len(checkpoint_sets),
        len(checkpoints),
        len(first),
        len(order),
    )
    return replace(recipe, bw_order=order, bw_checkpoints=checkpoints)


def segment_recompute_flops(original: SplitRecipe, segmented: SplitRecipe, profile: DeviceProfile) -> int:
    """FLOPs the segmented backward computes beyond the original's: its first pass, less what it no longer
    recomputes the original way (the checkpoints, and nodes only they read)."""
    return _extra(original, segmented, lambda n: node_cost(n, profile).flops)


def segment_recompute_seconds(original: SplitRecipe, segmented: SplitRecipe, profile: DeviceProfile) -> float:
    """``segment_recompute_flops`` in estimated seconds (``NodeCost.recompute_seconds``), for a plan's time."""
    return _extra(original, segmented, lambda n: node_cost(n, profile).recompute_seconds)


def _extra(original: SplitRecipe, segmented: SplitRecipe, cost):
    before = sum(cost(n) for n in recomputed_region(original))
    after = sum(cost(n) for n in recomputed_region(segmented))
    return sum(cost(i.node) for i in segmented.bw_order if type(i) is FirstPass) + after - before


# A segmentation whose simulated step peak is within this factor of the lowest is as good; among those, the
# fewest extra FLOPs wins (several checkpoint sets reach about the same peak).  The step peak (gradients included),
# not the activation peak: ranked by the activation peak, a segmentation can be higher as a step (docs/DESIGN.md
# §5.4 and §13: ``setting_peak.py``'s llama_stack and Mixtral rows).
PEAK_TOLERANCE = 1.02


def lowest_peak_segments(
    recipe: SplitRecipe,
    num_fwd_outputs: int,
    profile: DeviceProfile,
    limit: int | None = None,
    simulation: PeakEstimate | None = None,
    inputs=None,
    memory=None,
) -> tuple[SplitRecipe, PeakEstimate]:
    """The recipe itself or one of its segmentations (one per ``checkpoint_grid`` entry; ``limit``: only that many,
    lowest estimates first), whichever has the lowest simulated step peak (``_simulated_backwards``); within
    ``PEAK_TOLERANCE`` of it, the one with the fewest extra FLOPs.  Returns the recipe and its simulation.  Each
    candidate costs a simulation of its backward; ``simulation``: the recipe's own, where the caller has it already
    (the same graphs, so the same result: one simulation fewer); ``memory``: the joint graph's
    ``plan_memory.JointMemory``, where made: then no graph is built (``_simulated_backwards``)."""
    backend = inputs.backend if inputs is not None else None
    grid = sorted(checkpoint_grid(recipe, backend), key=lambda entry: entry[0])[:limit]
    candidates = [recipe, *(segment_backward(recipe, sets, backend) for _, sets in grid)]
    extra = [segment_recompute_flops(recipe, c, profile) for c in candidates]
    simulated = [simulation] if simulation is not None else []
    if len(candidates) > len(simulated):
        # no candidate peaks below its forward's peak: where that is the recipe's own peak, and none adds fewer
        # FLOPs than the recipe (none does: ``_extra``), the recipe is the choice whatever the others simulate to
        floor = simulation.peak_bytes if simulation is not None and min(extra) >= extra[0] else None
        found = _simulated_backwards(recipe, candidates[len(simulated) :], num_fwd_outputs, inputs, memory, floor)
        if found is None:
            return recipe, simulation
        simulated += found
    lowest = min(p.peak_bytes for p in simulated)
    good = [i for i, p in enumerate(simulated) if p.peak_bytes <= PEAK_TOLERANCE * lowest]
    best = min(good, key=lambda i: (extra[i], i))
    log.debug("segments: %d candidates, chose %d (%d bytes)", len(candidates), best, simulated[best].peak_bytes)
    return candidates[best], simulated[best]


def _simulated_backwards(recipe: SplitRecipe, candidates: list, num_fwd_outputs: int, inputs, memory, floor=None):
    """The simulated steps of ``recipe``'s forward with each candidate's backward.  The segmentations change
    backward alone (``segment_backward``): one forward, simulated once.  Where ``memory`` is a ``JointMemory`` of
    the recipe's joint graph, and that graph has no convolution (no layout decision, ``plan_memory.py``), no graph
    is built: the forward is the view of its joint nodes (``plan_memory.forward_view``) and each backward its view
    (``segment_view.py``), which read what the plans' estimates computed of those nodes rather than graphs built
    and simulated afresh: the same simulations (tests/passes/test_segments.py).  None, simulating no backward,
    where ``floor`` (the recipe's own simulated peak, or None) is no higher than that forward's peak."""
    exact = memory is not None and memory.facts is not None and memory.joint is recipe.joint
    if not (exact and not has_convolution(recipe.joint)):
        backwards = (c.build_backward(lazy=True) for c in candidates)
        return list(simulate_backwards(recipe.build_forward(lazy=True), backwards, num_fwd_outputs, inputs=inputs))
    # the plan's estimate's forward, where it has one
    run = forward_simulation(memory, recipe) if inputs is None or inputs is memory.simulator else None
    if run is None:
        forward, copies = forward_view(memory, recipe)
        run = forward_run(forward, num_fwd_outputs, copies, inputs or memory.simulator)
    if floor is not None and max((moment for _, _, moment in run.timeline), default=0) >= floor:
        return None
    return [run.step(backward_view(memory, c), False) for c in candidates]
