"""simulate_step: the memory a training step holds over time, for a (forward, backward) split, without running it.

What it models (all in one place, so the rule can be checked against measurements — benchmarks/peak_memory.py):
* Peak means bytes allocated during the step above what was live at its start (parameters, buffers and inputs
  are not counted; gradients are, since they are allocated during backward and outlive it).
* Each graph runs as Inductor schedules it.  Every materialised buffer (below) is one unit of work; units of
  Inductor's own kernels (pointwise, copies, reductions, norms) fuse when they share a read or one reads the other,
  their loops have the same size and fusing makes no cycle (largest shared bytes first, then the closest pair:
  ``score_fusion``); a column reduction (a norm's weight gradient) fuses only with column reductions of its shape,
  since it reads its input at other indices than a row loop (``lowering.column_reduction``); the fused kernel runs
  at its earliest member's place, dependencies first (``Scheduler.fuse_nodes`` then ``topological_sort_schedule``).
  Matmuls, convolutions, attention and custom ops run alone.  Fusion moves work: e.g. a recomputed GELU and its
  backward fuse through their shared read of the saved input, so the saved input dies before the weight gradient's
  matmul that sat between them in graph order.
* A unit allocates its output's storage when it runs; a storage is freed after the last kernel that reads it or any
  alias of it.  Views (and items of view tuples) allocate nothing; a buffer read only inside its own fused kernel
  never leaves it.  A kernel unit writes in place over an input of the same size that no other unit reads, its
  own kernel's included unless they feed it (Inductor's in-place update), including backward's saved inputs, which
  backward frees as they die, never its tangents (not donated).
* On CPU a ``cat`` is a ConcatKernel: a buffer of its own that its inputs' kernels write into, never an in-place
  update of an input (``lowering.concat_kernel``).  The op-level facts live in ``lowering.py``.
* Inductor's buffer reuse (``buffer_pool.py``): a freed buffer is held until a later allocation of the same size
  and dtype takes it, as long as Inductor's own estimate of the graph's memory stays within its estimated peak
  (``_pool_held``).
* What forward returns stays alive: saved values until their last use in backward, other outputs until forward
  ends (the caller drops them: ``model(x).sum().backward()`` keeps only the loss).  Backward's outputs (gradients)
  stay alive to the end.  Tangents are allocated when backward starts.
* Fusion away: a pointwise/copy/creation value whose every reader is one Inductor fuses it into (pointwise, copy,
  reduction, norm, view) never leaves its kernel, so it allocates nothing (``materialises``), whether or not those
  readers are returned; unless Inductor realizes it: read several times and costly (CPU), or reading many buffers
  (``_realized_on_reuse``).
* A loop's size: what a kernel writes or reads, except that a scatter loops over the values it scatters and a
  gather over the rows it picks (``scatter_values``).  An ``add`` of an ``mm`` is one addmm (``addmm_matmul``).
* Inductor's layout optimisation (``layout.py``): in a forward with 2-D convolutions, the channels-last copies of
  graph inputs read by a convolution are allocated when forward starts and, when saved, held until their last use
  in backward; mkldnn's ``convolution_backward`` holds two extra weight-sized buffers while it returns the weight
  gradient (``workspace_bytes``: counted while the op runs, gone after it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .buffer_pool import _pool_held
from .costs import alias_root, hinted_numel, value_nbytes
from .layout import channels_last_copies, layout_optimised, workspace_bytes
from .lowering import (  # noqa: F401  (re-exported: plan_memory, tests)
    FUSED_LOADS,
    HEAVY_OPS,
    KERNEL_CLASSES,
    MAX_READS,
    MAX_READS_CPU,
    POINTWISE_SCATTERS,
    REALIZE_READS_THRESHOLD,
    _folded_into_addmm,
    _readers_through_views,
    addmm_matmul,
    column_reduction,
    concat_kernel,
    inductor_class,
    scatter_values,
)
from .ops import FUSIBLE, OpClass, op_class

aten = torch.ops.aten

# Readers a fusible producer folds into (Inductor's pointwise fusion, reduction prologues); views are looked through.
FUSES_INTO = (FUSIBLE - {OpClass.VIEW, OpClass.GETITEM}) | {OpClass.REDUCTION, OpClass.NORM}


@dataclass(frozen=True)
class PeakEstimate:
    peak_bytes: int  # the most bytes the step holds above its start
    peak_phase: str  # "forward" or "backward"
    peak_node: str  # the node running when the peak is reached
    forward_peak_bytes: int
    backward_peak_bytes: int
    gradient_bytes: int  # what backward returns (gradients), all of them
    activation_peak_bytes: int  # the most bytes held at once that are not gradients
    timeline: tuple[tuple[str, str, int], ...]  # (phase, node, most bytes held while it runs)


# How a node's output is held: never (views, tuples, placeholders, in-place mutations), always, or only when some
# reader does not fuse it away.  One rule for the simulation of a split (``materialises``) and of a plan
# (``plan_memory.py``).
NEVER, ALWAYS, FUSIBLE_VALUE = 0, 1, 2


def storage_kind(node: fx.Node, classes: dict[fx.Node, OpClass]) -> int:
    cls = classes[node]
    if cls is OpClass.GETITEM:
        # an item of a multi-output op (SDPA, var_mean) owns its storage; an item of a view tuple (split) does not
        parent = node.args[0]
        owns = classes.get(parent) is not OpClass.VIEW and isinstance(node.meta.get("val"), torch.Tensor)
        return ALWAYS if owns else NEVER
    if isinstance(node.meta.get("val"), (tuple, list)):
        return NEVER  # the tuple itself holds nothing: its items are allocated (above)
    if cls in (OpClass.VIEW, OpClass.SYMBOLIC, OpClass.PLACEHOLDER, OpClass.OUTPUT):
        return NEVER
    if cls is OpClass.MUTATION:
        return NEVER  # writes into an existing storage (e.g. BatchNorm's running stats)
    if cls is OpClass.MATMUL and _folded_into_addmm(node, classes):
        return NEVER  # the addmm that reads it writes the product and the sum at once (``addmm_matmul``)
    return FUSIBLE_VALUE if cls in FUSIBLE else ALWAYS


def materialises(node: fx.Node, classes: dict[fx.Node, OpClass], outputs: set[fx.Node]) -> bool:
    kind = storage_kind(node, classes)
    if kind != FUSIBLE_VALUE:
        return kind == ALWAYS
    if node in outputs:
        return True
    # A returned reader fuses it like any other: Inductor computes a value inside each kernel that reads it, whether
    # or not that kernel's result is returned (the zeros a gradient's index_put starts from never exist alone).
    readers = _readers_through_views(node, classes)
    return not (readers and all(classes[u] in FUSES_INTO for u in readers))


def _tensor_storage_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return value_nbytes(val) if isinstance(val, torch.Tensor) else 0


# Graph inputs Inductor's memory estimate never counts, by name (``is_nonfreeable_buffers``): parameters, tangents.
# It counts every other input of backward as freed after its last reader, saved views of parameters (a transposed
# weight) included, at the view's size, although their storage outlives the graph.
NONFREEABLE_INPUTS = ("primals_", "arg", "fwd_rng_state", "bwd_rng_state", "tangents")

# Scheduler nodes apart beyond which Inductor does not fuse horizontally (torch/_inductor/scheduler.py).
FUSION_DISTANCE = 64


def _numel(node: fx.Node) -> int:
    return hinted_numel(node.meta.get("val"))


class _Phase:
    """One graph run as Inductor schedules it: its materialised buffers grouped into kernels (fusion), the kernels
    in an execution order, and the live storages (root node name -> bytes) walked over that order."""

    def __init__(
        self,
        graph: fx.Graph,
        keep: set[str],
        carried: dict[str, int],
        gradients: frozenset = frozenset(),
        channels_last: bool = False,
        estimated_inputs: dict[str, int] | None = None,
        donated: frozenset | None = None,
    ):
        self.nodes = list(graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.classes = {n: inductor_class(n, op_class(n)) for n in self.nodes}
        self.output = next(n for n in reversed(self.nodes) if n.op == "output")
        self.roots = {n: alias_root(n, self.classes) for n in self.nodes}
        # a returned view keeps its base: the base must be materialised even if it would otherwise fuse away
        self.returned = {a for a in self.output.all_input_nodes} | {self.roots[a] for a in self.output.all_input_nodes}
        self.keep = keep  # root names that outlive this graph
        self.gradients = gradients  # root names that are gradients (not activations)
        self.carried = dict(carried)
        # the graph inputs Inductor's own memory estimate counts (``_pool_held``), by default what is carried in
        self.estimated_inputs = self.carried if estimated_inputs is None else estimated_inputs
        # carried storages a kernel may write over (Inductor's in-place update takes a graph input only when it is
        # donated: backward's saved tensors, never its tangents), by default all of them
        self.donated = frozenset(self.carried) if donated is None else donated
        self.activation_peak = 0
        self._sizes: dict[fx.Node, int] = {}  # node -> elements (``_numel``), computed once per node
        self._find_units()
        self.workspace = {u: workspace_bytes(u, channels_last) for u in self.units}
        self._fuse()

    # --- what runs: units (one per materialised buffer or multi-output op), and what each reads ---------------

    def _unit_of(self, node: fx.Node) -> fx.Node | None:
        """The node whose kernel produces ``node``'s storage, or None (placeholders, views, values fused away)."""
        cls = self.classes[node]
        if node.op in ("placeholder", "output") or cls in (OpClass.VIEW, OpClass.SYMBOLIC):
            return None
        if cls is OpClass.GETITEM:
            parent = node.args[0]
            return self._unit_of(parent) if self.classes.get(parent) is not OpClass.VIEW else None
        if isinstance(node.meta.get("val"), (tuple, list)) or cls is OpClass.MUTATION:
            return node
        return node if materialises(node, self.classes, self.returned) else None

    def _find_units(self) -> None:
        self.unit = {}
        # storages each node's computation reads: through views to their root, through fused-away values to theirs
        reads: dict[fx.Node, frozenset[fx.Node]] = {}
        # what sizes its loop: the same, less the tables a fused load picks rows from (an embedding's weight), plus
        # the fused-away values computed inside it (the rows picked)
        loop: dict[fx.Node, frozenset[fx.Node]] = {}
        heavy: dict[fx.Node, bool] = {}  # its computation, fused-away producers included, has a costly op
        for node in self.nodes:
            found: set[fx.Node] = set()
            sized: set[fx.Node] = set()
            costly = getattr(node.target, "overloadpacket", None) in HEAVY_OPS
            table = node.args[0] if getattr(node.target, "overloadpacket", None) in FUSED_LOADS else None
            for arg in node.all_input_nodes:
                if not isinstance(arg.meta.get("val"), torch.Tensor):
                    continue  # an item of a multi-output op: its kernel is the op's
                root = self.roots[arg]
                if root.op == "placeholder" or self.unit[root] is not None:
                    found.add(root)
                    if arg is not table:
                        sized.add(root)
                else:
                    found |= reads[root]
                    sized |= loop[root] | {root}
                    costly = costly or heavy[root]
            reads[node] = frozenset(found)
            loop[node] = frozenset(sized)
            heavy[node] = costly
            unit = self._unit_of(node)
            if unit is None and self._realized_on_reuse(node, found, costly):
                unit = node
            self.unit[node] = unit
        self.units = [n for n in self.nodes if self.unit[n] is n]
        members: dict[fx.Node, list[fx.Node]] = {u: [] for u in self.units}
        for node in self.nodes:
            if self.unit[node] is not None:
                members[self.unit[node]].append(node)
        self.members = members
        self.unit_reads = {u: frozenset().union(*(reads[m] for m in members[u])) for u in self.units}
        self.loop_reads = {u: frozenset().union(*(loop[m] for m in members[u])) for u in self.units}
        # every storage a unit owns (a multi-output op owns its items')
        self.owned = {u: [m for m in members[u] if self._allocates(m)] for u in self.units}

    def _realized_on_reuse(self, node: fx.Node, reads: set[fx.Node], costly: bool) -> bool:
        """Inductor stores a value read by more than one node instead of computing it inside each reader when that
        computation is costly: on CPU one with exp, log, sigmoid or tanh, or one reading more than 4 buffers
        (``StorageBox.should_realize_on_reuse``, ``config.realize_reads_threshold``).  E.g. a SiLU backward read
        by both the expert weight's gradient and the input's: one tokens x hidden buffer."""
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or storage_kind(node, self.classes) != FUSIBLE_VALUE:
            return False
        cpu = val.device.type == "cpu"
        if len(reads) > (MAX_READS_CPU if cpu else MAX_READS):
            return True  # ``has_exceeded_max_reads``: any value, read once or more (a recomputed residual stream)
        if len(node.users) < 2:
            return False
        return (costly and cpu) or len(reads) > REALIZE_READS_THRESHOLD

    def _allocates(self, node: fx.Node) -> bool:
        return (
            self.roots[node] is node
            and isinstance(node.meta.get("val"), torch.Tensor)
            and self.classes[node] is not OpClass.MUTATION
        )

    def _numel(self, unit: fx.Node) -> int:
        """The iteration space of a unit's loop: the largest tensor it writes or reads (a reduction's input); a
        scatter's loop runs over the values it scatters (``scatter_values``), whatever the size of its output."""
        values = scatter_values(unit) if op_class(unit) is OpClass.GATHER else None
        if values is not None:
            return _numel(values)
        sizes = self._sizes  # one storage is read by many units: its size is computed once
        for n in (*self.owned[unit], *self.loop_reads[unit]):
            if n not in sizes:
                sizes[n] = _numel(n)
        return max((sizes[n] for n in (*self.owned[unit], *self.loop_reads[unit])), default=0)

    def _loop(self, unit: fx.Node) -> tuple:
        """What must match for two units to share a kernel: the loop's size (``_numel``); for a column reduction
        (``column_reduction``) its kept and reduced sizes, which only another such reduction matches."""
        column = column_reduction(unit)
        return ("column", *column) if column is not None else ("flat", self._numel(unit))

    # --- fusion: kernels Inductor merges (shared reads, producer into consumer) when the loops match ----------

    def _fuse(self) -> None:
        units = self.units
        group = {u: u for u in units}  # union-find over units

        def find(u):
            while group[u] is not u:
                group[u] = group[group[u]]
                u = group[u]
            return u

        # unit DAG (over groups, kept up to date as groups merge)
        succ: dict[fx.Node, set[fx.Node]] = {u: set() for u in units}
        pred: dict[fx.Node, set[fx.Node]] = {u: set() for u in units}
        for u in units:
            for r in self.unit_reads[u]:
                p = self.unit.get(r)
                if p is not None and p is not u:
                    succ[p].add(u)
                    pred[u].add(p)
        fusible = [u for u in units if self.classes[u] in KERNEL_CLASSES]
        numel = {u: self._loop(u) for u in fusible}
        candidates: dict[tuple[fx.Node, fx.Node], int] = {}
        readers: dict[fx.Node, list[fx.Node]] = {}
        for u in fusible:
            for r in self.unit_reads[u]:
                readers.setdefault(r, []).append(u)
        unit_order = {u: k for k, u in enumerate(units)}
        for r, us in readers.items():
            nbytes = _tensor_storage_bytes(r)
            p = self.unit.get(r)
            if p is not None and p in numel:
                for b in us:  # producer into consumer
                    if b is not p and numel[b] == numel[p]:
                        key = (p, b) if self.index[p] < self.index[b] else (b, p)
                        candidates[key] = candidates.get(key, 0) + nbytes
            # two readers (horizontal): only within FUSION_DISTANCE of each other (checked again on merging), which
            # keeps a storage read by every block (a mask, a rotary table) from making this quadratic; only readers
            # with loops of one size can fuse, so they are paired within those groups alone (in graph order, so
            # each pair is already its key).  A residual stream read through fused-away adds gives 150k pairs here
            # at 48 blocks: this loop is kept tight.
            same_size: dict[int, list[fx.Node]] = {}
            for u in sorted(us, key=unit_order.__getitem__):
                same_size.setdefault(numel[u], []).append(u)
            for group_ in same_size.values():
                orders = [unit_order[u] for u in group_]
                for i, a in enumerate(group_):
                    reach = orders[i] + FUSION_DISTANCE
                    for j in range(i + 1, len(group_)):
                        if orders[j] > reach:
                            break
                        key = (a, group_[j])
                        candidates[key] = candidates.get(key, 0) + nbytes
        lo = {u: self.index[u] for u in units}
        hi = dict(lo)

        def creates_cycle(a, b) -> bool:
            # a path a -> x -> ... -> b through another group (or b -> ... -> a); all paths run forward in graph order
            for start, end in ((a, b), (b, a)):
                stack = [s for s in succ[start] if s is not end]
                seen = set(stack)
                while stack:
                    g = stack.pop()
                    if g is end:
                        return True
                    for s in succ[g]:
                        if s not in seen and lo[s] <= hi[end]:
                            seen.add(s)
                            stack.append(s)
            return False

        # Inductor refuses a horizontal fusion (two kernels sharing a read, neither reading the other) of kernels
        # more than 64 scheduler nodes apart (``Scheduler.are_long_distant_nodes``: it would lengthen live ranges,
        # e.g. fuse recomputations of different checkpointed segments).  Units stand for scheduler nodes.
        order = {u: k for k, u in enumerate(units)}
        first = {u: order[u] for u in units}
        last = dict(first)

        def too_far(ga, gb) -> bool:
            vertical = gb in succ[ga] or ga in succ[gb]
            return not vertical and max(abs(first[ga] - last[gb]), abs(first[gb] - last[ga])) > FUSION_DISTANCE

        # Largest shared bytes first; of equal ones, the two closest in order (Inductor's ``score_fusion``: memory
        # score, then proximity): the recomputed norm of a block's input fuses with the norm backward beside it,
        # not with a recomputed norm of the same input twenty kernels earlier (which would pull the whole
        # recomputed block to there).
        def priority(kv):
            (a, b), nbytes = kv
            return (-nbytes, abs(order[b] - order[a]), self.index[a], self.index[b])

        for (a, b), _ in sorted(candidates.items(), key=priority):
            ga, gb = find(a), find(b)
            if ga is gb or too_far(ga, gb) or creates_cycle(ga, gb):
                continue
            first[ga], last[ga] = min(first[ga], first[gb]), max(last[ga], last[gb])
            group[gb] = ga
            lo[ga], hi[ga] = min(lo[ga], lo[gb]), max(hi[ga], hi[gb])
            for s in succ.pop(gb):
                pred[s].discard(gb)
                if s is not ga:
                    pred[s].add(ga)
                    succ[ga].add(s)
            for p in pred.pop(gb):
                succ[p].discard(gb)
                if p is not ga:
                    succ[p].add(ga)
                    pred[ga].add(p)
            succ[ga].discard(ga)
            pred[ga].discard(ga)
        kernels: dict[fx.Node, list[fx.Node]] = {}
        for u in units:
            kernels.setdefault(find(u), []).append(u)
        self.kernels = kernels  # group head -> its units, in graph order
        self.kernel_succ, self.kernel_pred = succ, pred
        self.kernel_lo = lo

    def fusion_order(self) -> list[fx.Node]:
        """Inductor's order after fusion: each kernel at its earliest member, then dependencies first."""
        order: list[fx.Node] = []
        seen: set[fx.Node] = set()
        for head in sorted(self.kernels, key=lambda g: self.kernel_lo[g]):
            stack = [(head, iter(sorted(self.kernel_pred[head], key=lambda g: self.kernel_lo[g])))]
            if head in seen:
                continue
            seen.add(head)
            while stack:
                g, deps = stack[-1]
                nxt = next((d for d in deps if d not in seen), None)
                if nxt is None:
                    order.append(g)
                    stack.pop()
                else:
                    seen.add(nxt)
                    stack.append((nxt, iter(sorted(self.kernel_pred[nxt], key=lambda d: self.kernel_lo[d]))))
        return order

    def _inplace_candidate(
        self, unit: fx.Node, nbytes: int, live: dict[str, int], remaining: dict[str, int], kernel: list[fx.Node]
    ):
        """A live input storage of the same size that no other unit will read (Inductor's in-place update, which
        also takes backward's saved inputs, freed as they die), or None.

        Inductor counts a buffer's readers per scheduler node (unit) and marks them done only after their whole
        fused kernel (``decide_inplace_update``: one remaining use, ancestors excepted): a storage that two units of
        one kernel read, neither feeding the other, is written over by neither.  E.g. a recomputed SwiGLU backward
        reads gate, up and the incoming gradient in three units of one kernel, so its three outputs are new buffers.
        ``remaining`` still counts this kernel's readers."""
        ancestors: set[fx.Node] | None = None
        for r in sorted(self.unit_reads[unit], key=lambda r: self.index[r]):
            if live.get(r.name) != nbytes or r.name in self.keep:
                continue
            if r.name in self.carried and r.name not in self.donated:
                continue
            if remaining[r.name] > 1 and ancestors is None:
                ancestors = self._ancestors_within(unit, kernel)
            done = sum(1 for v in ancestors or () if r in self.unit_reads[v])
            if remaining[r.name] == 1 + done:
                return r.name
        return None

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

    # --- the walk ---------------------------------------------------------------------------------------------

    def run(self, phase: str, timeline: list, order: list[fx.Node] | None = None) -> int:
        order = self.fusion_order() if order is None else order
        last_use: dict[str, int] = {}
        for head_pos, head in enumerate(order):
            for u in self.kernels[head]:
                for r in self.unit_reads[u]:
                    last_use[r.name] = max(last_use.get(r.name, -1), head_pos)
        remaining = {}  # storage name -> units still to read it
        for u in self.units:
            for r in self.unit_reads[u]:
                remaining[r.name] = remaining.get(r.name, 0) + 1
        live = dict(self.carried)
        # running sums instead of summing every live storage at every unit (linear in the graph)
        total = sum(live.values())
        gradients = sum(b for name, b in live.items() if name in self.gradients)
        peak = total
        dies: dict[int, list[str]] = {}
        for name, k in last_use.items():
            dies.setdefault(k, []).append(name)
        # For Inductor's buffer reuse (``_pool_held``): its own estimate of the memory each kernel runs with, and the
        # buffers each kernel allocates and frees.
        estimated: list[int] = []
        counted: dict[str, int] = {}  # storages Inductor's estimate holds
        allocated: list[list[tuple[int, object]]] = []  # per kernel: (bytes, reuse key) of fresh buffers
        freed: list[list[object]] = []  # per kernel: reuse keys of the buffers it frees into the pool
        poolable: dict[str, object] = {}  # storage name -> reuse key, for buffers whose free enters the pool
        points: list[tuple[int, str, int, int]] = []  # (kernel, unit, bytes live while it runs, of them gradients)

        def free(name: str) -> None:
            nonlocal total, gradients
            nbytes = live.pop(name)
            total -= nbytes
            if name in self.gradients:
                gradients -= nbytes

        for name in [n for n in live if last_use.get(n, -1) < 0 and n not in self.keep]:
            free(name)  # carried in, never read here
        counted.update((n, b) for n, b in self.estimated_inputs.items() if last_use.get(n, -1) >= 0 or n in self.keep)
        estimate = sum(counted.values())
        for k, head in enumerate(order):
            allocated.append([])
            freed.append([])
            for u in self.kernels[head]:
                for node in self.owned[u]:
                    nbytes = _tensor_storage_bytes(node)
                    counted[node.name] = nbytes  # the estimate has no in-place updates and counts kernel-local buffers
                    estimate += nbytes
                    if node.name not in self.keep and last_use.get(node.name, -1) == k and node not in self.returned:
                        continue  # read only inside its own kernel: never leaves it
                    reused = None
                    if self.classes[u] in KERNEL_CLASSES and not concat_kernel(u):
                        reused = self._inplace_candidate(u, nbytes, live, remaining, self.kernels[head])
                        if reused is not None:
                            free(reused)  # Inductor writes the result over an input only this kernel still reads
                    key = self._reuse_key(u, node)
                    if key is not None:
                        poolable[node.name] = key
                        if reused is None:
                            allocated[k].append((nbytes, key))
                    live[node.name] = live.get(node.name, 0) + nbytes
                    total += nbytes
                    if node.name in self.gradients:
                        gradients += nbytes
                points.append((k, u.name, total + self.workspace[u], gradients))  # workspace: freed before it returns
            estimated.append(estimate)
            gone: list[str] = []
            for u in self.kernels[head]:
                for r in self.unit_reads[u]:
                    remaining[r.name] -= 1  # a kernel's reads are done when the whole kernel is
                for node in self.owned[u]:  # written here and never read later: gone after this kernel
                    if last_use.get(node.name, -1) < k and node.name not in self.keep:
                        gone.append(node.name)
            gone += dies.get(k, ())
            for name in gone:
                if name in self.keep:
                    continue
                if name in counted:
                    estimate -= counted.pop(name)
                if name in live:
                    free(name)
                    if name in poolable:
                        freed[k].append(poolable[name])
        held = _pool_held(estimated, allocated, freed)
        activation_peak = 0
        for k, name, moment, grads in points:
            moment += held[k]
            peak = max(peak, moment)
            activation_peak = max(activation_peak, moment - grads)
            timeline.append((phase, name, moment))
        self.live = live
        self.activation_peak = activation_peak
        return peak

    def _reuse_key(self, unit: fx.Node, node: fx.Node):
        """The key under which Inductor's wrapper pools ``node``'s buffer for reuse (size and dtype:
        ``buffer_reuse_key``), or None: only buffers it allocates itself (its kernels' outputs, and the ``out=``
        of a matmul) are pooled; a fallback op's outputs (attention, multi-output ops) are marked unaligned and never
        match an allocation."""
        if self.classes[unit] in KERNEL_CLASSES or (self.classes[unit] is OpClass.MATMUL and unit is node):
            return (_tensor_storage_bytes(node), node.meta["val"].dtype)
        return None


def simulate_step(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> PeakEstimate:
    timeline: list[tuple[str, str, int]] = []
    fw_output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    fw_returns = [a for a in fw_output.args[0] if isinstance(a, fx.Node)]
    saved = fw_returns[num_fwd_outputs:]
    fw_classes = {n: op_class(n) for n in fw.graph.nodes}
    saved_roots = {alias_root(n, fw_classes).name for n in saved}
    user_roots = {alias_root(n, fw_classes).name for n in fw_returns[:num_fwd_outputs]}
    # Channels-last copies of graph inputs (Inductor's layout optimisation) are allocated as forward starts and
    # stand in for their placeholder from then on: freed after its last reader, or carried into backward if saved.
    channels_last = layout_optimised(fw)
    forward = _Phase(fw.graph, keep=saved_roots | user_roots, carried=channels_last_copies(fw))
    forward_peak = forward.run("forward", timeline)

    # Into backward: saved storages plus the tangents autograd allocates.  Forward returns saved tensors, then saved
    # SymInts; backward takes the SymInts first, then the tensors (in the same order), then the tangents.
    saved_tensors = [n for n in saved if isinstance(n.meta.get("val"), torch.Tensor)]
    num_symbols = len(saved) - len(saved_tensors)
    bw_placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    tensor_placeholders = bw_placeholders[num_symbols : num_symbols + len(saved_tensors)]
    carried: dict[str, int] = {}
    carried_roots: set[str] = set()
    for placeholder, value in zip(tensor_placeholders, saved_tensors):
        root_name = alias_root(value, fw_classes).name
        if root_name in forward.live and root_name not in carried_roots:
            carried_roots.add(root_name)  # two saved views of one storage: counted once (freed with the first)
            carried[placeholder.name] = forward.live[root_name]
    for placeholder in bw_placeholders[num_symbols + len(saved_tensors) :]:
        carried[placeholder.name] = _tensor_storage_bytes(placeholder)
    bw_output = next(n for n in reversed(bw.graph.nodes) if n.op == "output")
    gradients = {alias_root(a).name for a in bw_output.all_input_nodes}
    backward = _Phase(
        bw.graph,
        keep=gradients,
        carried=carried,
        gradients=frozenset(gradients),
        channels_last=channels_last,
        estimated_inputs={
            p.name: _tensor_storage_bytes(p) for p in tensor_placeholders if not p.name.startswith(NONFREEABLE_INPUTS)
        },
        # AOTAutograd donates backward's saved tensors (``bw_donated_idxs``) but not those a forward output aliases
        donated=frozenset(
            p.name
            for p, v in zip(tensor_placeholders, saved_tensors)
            if alias_root(v, fw_classes).name not in user_roots
        ),
    )
    backward_peak = backward.run("backward", timeline)
    gradient_bytes = sum(
        _tensor_storage_bytes(a) for a in bw_output.all_input_nodes if alias_root(a).op != "placeholder"
    )
    peak_phase, peak_node, peak = "forward", "", 0
    for phase, node, total in timeline:
        if total > peak:
            peak_phase, peak_node, peak = phase, node, total
    return PeakEstimate(
        peak_bytes=peak,
        peak_phase=peak_phase,
        peak_node=peak_node,
        forward_peak_bytes=forward_peak,
        backward_peak_bytes=backward_peak,
        gradient_bytes=gradient_bytes,
        activation_peak_bytes=max(forward.activation_peak, backward.activation_peak),
        timeline=tuple(timeline),
    )
