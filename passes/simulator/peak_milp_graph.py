"""build_schedule_graph: a joint graph as the plain-number ``ScheduleGraph`` of the exact peak MILP (peak_milp.py).

From ``plan_memory.build_joint_memory`` (read only: its inputs, root, nbytes, hold, view_like, placeholder and
gradient fields) and the flow problem's recompute seconds, in three steps:

1. **Exact reductions.**  Placeholders (primals, tangents) are free nodes.  A view or any alias allocates nothing:
   it becomes its storage's owner (``root``), so reading a view reads its base.  A multi-output op (SDPA,
   native_layer_norm) is a node of no bytes of its own that holds all its items' bytes while it runs
   (``transient_bytes``) and cannot be held across stages (``holdable``); each item that owns its output is a node
   of its own, read from the op, so it is made only where the op runs and can be saved alone.  In backward (run
   once, never saved) the op and its items are one node of all their bytes.  A node that
   allocates nothing of its own (SymInt arithmetic, in-place writes into a graph input) passes its readers on to
   its own inputs.  Nodes neither an output nor a gradient depends on are dropped.
2. **Merging, for graphs above ``max_nodes``.**  A node read by exactly one other node of the same phase (a
   pointwise chain, a matmul feeding one bias add) is merged into its reader, smallest first, until the graph has
   at most ``max_nodes`` nodes or nothing more can merge.  The merged node keeps its reader's output bytes, adds
   the compute, and records what the inside held above that as ``transient_bytes`` (the first member's output
   while the second runs, or its own transient).  Never merged: required nodes and ``keep_distinct`` (the nodes a
   compared plan saves), so each of fxremat's plans is still a plan of the merged graph, with the same compute;
   the MILP, though, can no longer keep a merged-away value, so on merged graphs its optimum is for a coarser
   choice than fxremat had.
3. **Stages.**  One backward stage per backward node, or, above ``max_stages`` backward nodes, that many stages of
   consecutive backward nodes (about one per block on a stack).

Compute seconds: a forward node's recompute seconds from the flow problem (``flow.parametric.recompute_seconds``,
the cut's own estimate); a node that may not be recomputed (random ops) gets 0 and ``recomputable=False``;
backward nodes get 0 (they run once in every schedule).

How the MILP's model differs from ``liveness.simulate_step`` (the simulation of a real split), on purpose: it has to
be linear and the same for every schedule.  No Inductor fusion (every value that owns storage allocates it, unless
merged away in step 2), no in-place reuse of a dying input, no buffer pool, no realization rules, no layout copies
or convolution workspace.  Tangents and graph inputs cost nothing (``simulate_step`` allocates tangents when
backward starts); a forward output is freed after its last reader in forward unless held (``simulate_step`` keeps
it to forward's end); a gradient counts until its last reader in backward and is then handed over (the activation
peak; ``simulate_step`` keeps gradients to the end and subtracts them for its activation peak), or, with
``step_peak``, is kept to the step's end (``ScheduleGraph.kept``: the step's peak, which ``simulate_step`` and the
planner judge plans by, parameters left out as the same bytes in every schedule).  Backward nodes run
in graph order, one stage each, and a stage's recomputation runs at its start: where stages group several backward
nodes, that is earlier than ``reordering_to_mimic_autograd_engine`` would put it.  The frees are the same rule:
after the last reader, a view's reads counting as its base's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from ..graph.flow_problem import FlowProblem
from ..graph.roles import GraphRoles, Role
from ..solver.peak_milp import ScheduleGraph
from .plan_memory import JointMemory, build_joint_memory
from .storage import NEVER

DEFAULT_MAX_NODES = 60
DEFAULT_MAX_STAGES = 24


@dataclass
class _Group:
    """A schedule node while it is being built: joint nodes merged into one."""

    owner: int  # the joint node whose output the group's readers read
    members: list[int]
    nbytes: int
    backward: bool
    free: bool = False
    seconds: float = 0.0
    recomputable: bool = True
    transient: int = 0
    holdable: bool = True
    reads: set[int] = field(default_factory=set)  # owners of the groups read


@dataclass(frozen=True)
class JointSchedule:
    graph: ScheduleGraph
    group_of: tuple[int | None, ...]  # joint node index -> schedule node (None: a free or pass-through node)
    names: tuple[str, ...]  # schedule node -> its owner's name in the joint graph
    joint_names: tuple[str, ...]

    def nodes_of(self, names) -> set[int]:
        """Schedule nodes of joint nodes named ``names`` (a report's ``saved``); free ones left out."""
        index = {n: i for i, n in enumerate(self.joint_names)}
        found = {self.group_of[index[n]] for n in names if n in index}
        return {g for g in found if g is not None and not self.graph.free[g]}


def build_schedule_graph(
    joint: fx.GraphModule,
    roles: GraphRoles,
    num_fwd_outputs: int,
    flow: FlowProblem,
    keep_distinct: set[str] = frozenset(),
    max_nodes: int = DEFAULT_MAX_NODES,
    max_stages: int = DEFAULT_MAX_STAGES,
    step_peak: bool = False,
) -> JointSchedule:
    """``joint`` prepared and classified as the partitioner does (``cse.prepare_joint_graph``, ``classify``).
    ``step_peak``: the gradients are kept to the step's end (the step's peak, not the activations')."""
    nodes = list(joint.graph.nodes)
    memory = build_joint_memory(joint, roles, num_fwd_outputs)
    groups, owner_of = _exact_groups(memory, nodes, roles)
    _add_compute(groups, nodes, flow)
    required = {owner_of[i] for i in (*memory.forward_outputs, *memory.gradients) if owner_of.get(i) is not None}
    required = {r for r in required if not groups[r].free}
    _drop_dead(groups, required)
    protected = required | {owner_of[i] for i, n in enumerate(nodes) if n.name in keep_distinct and owner_of.get(i)}
    _merge_chains(groups, protected, max_nodes)
    gradients = {owner_of[i] for i in memory.gradients if owner_of.get(i) is not None} if step_peak else set()
    return _freeze(groups, owner_of, nodes, required, max_stages, gradients)


def _exact_groups(memory: JointMemory, nodes: list[fx.Node], roles: GraphRoles):
    """Step 1: groups keyed by owner, and each joint node's owner (None: passes its readers on)."""
    groups: dict[int, _Group] = {}
    owner_of: dict[int, int | None] = {}
    passes_on: dict[int, set[int]] = {}  # a pass-through node -> the owners it stands for
    for i, node in enumerate(nodes):
        if node.op == "output":
            continue
        reads: set[int] = set()
        for a in memory.inputs[i]:
            reads |= passes_on[a] if owner_of.get(a) is None else {owner_of[a]}
        backward = roles.role.get(node) is Role.BACKWARD
        if memory.placeholder[i]:
            groups[i] = _Group(i, [i], 0, backward=roles.role.get(node) is Role.TANGENT, free=True)
            owner_of[i] = i
        elif memory.root[i] != i:
            owner_of[i] = owner_of.get(memory.root[i])
            passes_on[i] = passes_on.get(memory.root[i], set())
        elif memory.view_like[i] and len(memory.inputs[i]) == 1 and owner_of.get(memory.inputs[i][0]) is not None:
            parent = groups[owner_of[memory.inputs[i][0]]]  # an item of a multi-output op: made when the op runs
            if parent.backward:  # runs once, in its stage: its items are simply its bytes
                parent.nbytes += memory.nbytes[i]
                parent.members.append(i)
                owner_of[i] = parent.owner
            else:
                parent.transient += memory.nbytes[i]
                parent.holdable = False
                groups[i] = _Group(i, [i], memory.nbytes[i], backward=backward, reads={parent.owner})
                owner_of[i] = i
        elif memory.nbytes[i] > 0 and memory.hold[i] != NEVER or _has_items(memory, i):
            groups[i] = _Group(i, [i], memory.nbytes[i], backward=backward, reads=reads)
            owner_of[i] = i
        else:
            owner_of[i] = None
            passes_on[i] = reads
    for g in groups.values():
        g.reads.discard(g.owner)
    return groups, owner_of


def _has_items(memory: JointMemory, i: int) -> bool:
    """A multi-output op: some reader is an item that owns its storage."""
    return any(memory.view_like[u] and memory.root[u] == u and memory.nbytes[u] for u in memory.users[i])


def _add_compute(groups: dict[int, _Group], nodes: list[fx.Node], flow: FlowProblem) -> None:
    value = {n: v for v, n in enumerate(flow.nodes)}
    for g in groups.values():
        if g.free or g.backward:
            continue
        for i in g.members:
            v = value.get(nodes[i])
            seconds = None if v is None else flow.parametric.recompute_seconds[v]
            g.recomputable &= seconds is not None
            g.seconds += seconds or 0.0


def _drop_dead(groups: dict[int, _Group], required: set[int]) -> None:
    alive, stack = set(), list(required)
    while stack:
        g = stack.pop()
        if g not in alive:
            alive.add(g)
            stack.extend(groups[g].reads)
    for g in [g for g in groups if g not in alive and not groups[g].free]:
        del groups[g]


def _merge_chains(groups: dict[int, _Group], protected: set[int], max_nodes: int) -> None:
    """Step 2: merge a node read by one node of its phase into that reader, smallest first."""
    while sum(not g.free for g in groups.values()) > max_nodes:
        readers: dict[int, list[int]] = {}
        for g in groups.values():
            for a in g.reads:
                readers.setdefault(a, []).append(g.owner)
        candidates = [
            (groups[u].nbytes, u, only[0])
            for u, only in readers.items()
            if len(only) == 1
            and u not in protected
            and not groups[u].free
            and groups[u].backward == groups[only[0]].backward
            and groups[u].recomputable == groups[only[0]].recomputable
        ]
        if not candidates:
            return
        _, u, v = min(candidates)
        inner, outer = groups.pop(u), groups[v]
        # while v's part runs, u's output is still live; while u's part ran, u's own transient was
        outer.transient = max(inner.nbytes + inner.transient - outer.nbytes, inner.nbytes + outer.transient, 0)
        outer.members = sorted(inner.members + outer.members)
        outer.seconds += inner.seconds
        outer.reads = (outer.reads | inner.reads) - {u, v}
        for g in groups.values():  # nobody else reads u (it had one reader), but keep the invariant
            if u in g.reads:
                g.reads = (g.reads - {u}) | {v}


def _freeze(groups, owner_of, nodes, required, max_stages: int, kept: set = frozenset()) -> JointSchedule:
    """Step 3: order (free nodes, forward, backward; graph order within each), stages, plain tuples."""
    order = sorted(groups.values(), key=lambda g: (not g.free, g.backward and not g.free, g.owner))
    position = {g.owner: p for p, g in enumerate(order)}
    backward = [g.owner for g in order if g.backward and not g.free]
    per_stage = max(1, -(-len(backward) // max_stages))  # ceil: consecutive backward nodes share a stage
    stage_of = {b: 1 + k // per_stage for k, b in enumerate(backward)}
    graph = ScheduleGraph(
        nbytes=tuple(g.nbytes for g in order),
        compute_seconds=tuple(g.seconds for g in order),
        inputs=tuple(tuple(sorted(position[a] for a in g.reads)) for g in order),
        backward=tuple(g.backward for g in order),
        required=tuple(sorted(position[r] for r in required)),
        free=tuple(g.free for g in order),
        recomputable=tuple(g.recomputable for g in order),
        transient_bytes=tuple(g.transient for g in order),
        holdable=tuple(g.holdable for g in order),
        stage=tuple(stage_of.get(g.owner, 0) for g in order),
        kept=tuple(g.owner in kept and g.backward and not g.free for g in order) if kept else (),
    )
    member_of = {i: position[g.owner] for g in order for i in g.members}
    group_of = tuple(member_of.get(owner_of.get(i)) if owner_of.get(i) is not None else None for i in range(len(nodes)))
    return JointSchedule(graph, group_of, tuple(nodes[g.owner].name for g in order), tuple(n.name for n in nodes))
