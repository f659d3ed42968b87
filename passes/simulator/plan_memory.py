"""estimate_peak: the step simulation of a *plan*, without building its split.

A peak-aware search ranks tens of plans by their simulated peak; building each one's forward and backward graphs
(FX node copies, code generation) costs more than simulating them.  ``estimate_peak`` runs the simulation itself,
``liveness.simulate_phases`` (every rule of ``liveness.py``'s docstring: Inductor's fusion and its order, in-place
writes over saved inputs, the values Inductor realizes, the lowering rules of ``lowering.py``, the buffer pool of
``buffer_pool.py``), over views of the joint graph's nodes (``phase_graph.virtual_phase``) in the places the split
would put them: ``split.split_recipe`` decides those (the forward's nodes and order, backward's extraction and
``reordering_to_mimic_autograd_engine``, ``raise_getitems``) on plain lists, and nothing is copied.  A split's graph
is the joint nodes it copies, under their names, with their ``meta``, targets and arguments; so the estimate equals
``simulate_step`` of the real split (test: every candidate plan of four example models), except for Inductor's
layout decision on a graph with convolutions, which is taken once on the joint graph (``layout.py``) rather than on
each forward.  A plan the split does not handle (``split.UnsupportedSplit``) is split by PyTorch and simulated.

``JointMemory`` also keeps the joint graph as plain integers, for the peak MILP's graph (``peak_milp_graph.py``),
read off the joint graph's ``graph_facts.GraphFacts`` (``roles.facts``): its index, inputs, users, alias roots,
Inductor classes, simulated bytes and outputs; its ``NodeFacts`` start from those facts too."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from .. import _torch_private as tp
from ..graph.graph_facts import graph_facts
from ..graph.ops import CONVOLUTION, OpClass
from ..graph.roles import GraphRoles
from ..rewrite.split import UnsupportedSplit, joint_facts, split_recipe
from .inputs import SimulatorInputs, inputs_for
from .layout import channels_last_copies, layout_optimised
from .liveness import PeakEstimate, forward_run, simulate_phases, simulate_step
from .node_facts import NodeFacts, joint_tables
from .phase_graph import PhaseGraph, virtual_phase
from .segment_view import ShadowNodes
from .segment_view import backward_view as segmented_view
from .storage import storage_kind


@dataclass(frozen=True)
class JointMemory:
    """The joint graph as plain integers (node index = position in graph order), and what its splits share."""

    inputs: tuple[tuple[int, ...], ...]
    users: tuple[tuple[int, ...], ...]
    root: tuple[int, ...]  # the node owning the storage a node aliases
    nbytes: tuple[int, ...]  # bytes a node allocates when it materialises (its own storage)
    hold: tuple[int, ...]  # NEVER / ALWAYS / FUSIBLE_VALUE
    view_like: tuple[bool, ...]  # readers are looked through (views, items of tuples)
    placeholder: tuple[bool, ...]
    forward_outputs: tuple[int, ...]
    gradients: tuple[int, ...]  # backward's outputs (gradients), as node indices
    # for estimate_peak: the joint graph, its nodes, what every split reads off it (None: PyTorch splits it), and
    # Inductor's layout decision (channels-last copies of placeholders, by name -> bytes, with their readers)
    joint: fx.GraphModule | None = field(default=None, compare=False)
    num_fwd_outputs: int = 0
    nodes: tuple[fx.Node, ...] = field(default=(), compare=False)
    facts: object = field(default=None, compare=False)
    static_inputs: object = field(default=None, compare=False)
    channels_last: bool = False
    layout_copies: tuple[tuple[str, int], ...] = ()
    node_facts: NodeFacts | None = field(default=None, compare=False)  # every plan's simulation reads these
    simulator: SimulatorInputs | None = field(default=None, compare=False)  # what every plan's simulation assumes
    # the stand-ins the views of its segmented backwards show (``segment_view.py``), kept for all of them
    shadows: ShadowNodes = field(default_factory=ShadowNodes, compare=False)
    # each forward's simulation (``forward_simulation``), by the forward's nodes: a plan's segmentations reuse
    # its estimate's (a segmentation changes backward alone)
    forward_runs: dict = field(default_factory=dict, compare=False)


def build_joint_memory(
    joint: fx.GraphModule, roles: GraphRoles, num_fwd_outputs: int, inputs: SimulatorInputs | None = None
) -> JointMemory:
    """``joint`` as plain integers, read off its facts (``roles.facts``, or ``graph_facts`` for roles without);
    ``inputs``: what its plans' simulations assume (by default, what the config in force implies for ``joint``)."""
    inputs = inputs_for(joint, inputs)
    graph = roles.facts if roles.facts is not None else graph_facts(joint, num_fwd_outputs)
    nodes, index, root = graph.nodes, graph.index, graph.alias_root
    storage_bytes, classes = joint_tables(graph, inputs.backend)
    try:
        facts = joint_facts(joint, num_fwd_outputs)
    except UnsupportedSplit:
        facts = None
    channels_last = layout_optimised(joint, inputs)
    return JointMemory(
        inputs=tuple(tuple(index[a] for a in dict.fromkeys(graph.inputs_of[n])) for n in nodes),
        users=tuple(tuple(index[u] for u in graph.users_of[n]) for n in nodes),
        # the root under Inductor's classes is the root under ours: neither makes a view, nor unmakes one
        root=tuple(index[root[n]] for n in nodes),
        nbytes=tuple(storage_bytes[n] for n in nodes),
        hold=tuple(storage_kind(n, classes, backend=inputs.backend) for n in nodes),
        view_like=tuple(classes[n] in (OpClass.VIEW, OpClass.GETITEM) for n in nodes),
        placeholder=tuple(n.op == "placeholder" for n in nodes),
        forward_outputs=tuple(index[a] for a in graph.fwd_outputs if isinstance(a, fx.Node)),
        gradients=tuple(index[a] for a in graph.bwd_outputs if isinstance(a, fx.Node)),
        joint=joint,
        num_fwd_outputs=num_fwd_outputs,
        nodes=nodes,
        facts=facts,
        static_inputs=roles.static_inputs,
        channels_last=channels_last,
        layout_copies=tuple(sorted(channels_last_copies(joint, inputs).items())) if channels_last else (),
        node_facts=NodeFacts(inputs.backend, graph),
        simulator=inputs,
    )


def estimate_peak(memory: JointMemory, saved: set[int]) -> PeakEstimate:
    """The simulated step of the plan that saves the nodes ``saved`` (node indices, in graph order: as the plan's
    split receives them) for backward: ``simulate_step`` of its split, without building the split."""
    recipe = plan_recipe(memory, saved)
    if recipe is None:
        return _simulate_pytorch_split(memory, *_saved_parts(memory, saved))
    backward = _view(memory, recipe.bw_inputs, recipe.bw_order, recipe.bw_outputs)
    run = forward_simulation(memory, recipe)
    if run is not None:
        return run.step(backward, memory.channels_last)
    forward, copies = forward_view(memory, recipe)
    return simulate_phases(forward, backward, memory.num_fwd_outputs, memory.channels_last, copies, memory.simulator)


def plan_recipe(memory: JointMemory, saved: set[int]):
    """The ``split.SplitRecipe`` of the plan that saves the nodes ``saved`` (as ``estimate_peak``'s), made without
    building the split; None where PyTorch splits the graph (no split facts, or a split fxremat's does not support)."""
    if memory.facts is None:
        return None
    values, symbols = _saved_parts(memory, saved)
    try:
        return split_recipe(memory.joint, values, symbols, num_fwd_outputs=memory.num_fwd_outputs, facts=memory.facts)
    except UnsupportedSplit:
        return None


def _saved_parts(memory: JointMemory, saved: set[int]) -> tuple[list, list]:
    """(the saved tensors, the saved symbolic sizes), in graph order."""
    nodes = [memory.nodes[i] for i in sorted(saved)]
    return [n for n in nodes if not tp.is_sym_node(n)], [n for n in nodes if tp.is_sym_node(n)]


def forward_simulation(memory: JointMemory, recipe):
    """The simulation of ``recipe``'s forward (``liveness.forward_run``, its steps with backwards after it), made once
    per forward and kept (``JointMemory.forward_runs``); None where its inputs have channels-last copies (then which
    saved inputs backward recopies depends on the backward: ``liveness.simulate_phases``).  Without copies
    ``simulate_phases`` simulates the same forward, whatever the backward: ``_ForwardRun.step`` reads it and leaves it
    unchanged."""
    key = (tuple(recipe.fw_inputs), tuple(recipe.fw_order), tuple(recipe.fw_outputs))
    known = memory.forward_runs.get(key)
    # a copy of ``memory`` with other inputs (``dataclasses.replace``) shares the dict: a run is its inputs' only
    if known is None or known[0] is not memory.simulator:
        forward, copies = forward_view(memory, recipe)
        run = None if copies else forward_run(forward, memory.num_fwd_outputs, {}, memory.simulator)
        known = memory.forward_runs[key] = (memory.simulator, run)
    return known[1]


def forward_view(memory: JointMemory, recipe) -> tuple[PhaseGraph, dict[str, int]]:
    """(the view of the forward ``recipe`` (a ``split.SplitRecipe`` of ``memory``'s joint graph) would build, the
    channels-last copies of its inputs that its convolutions read: ``channels_last_copies`` of its graph)."""
    forward = _view(memory, recipe.fw_inputs, recipe.fw_order, recipe.fw_outputs)
    copies = {}
    if memory.layout_copies:
        read = {p for n in recipe.fw_order if n.target is CONVOLUTION for p in forward.inputs_of[n][:2]}
        copies = {name: b for name, b in memory.layout_copies if any(p.name == name for p in read)}
    return forward, copies


def backward_view(memory: JointMemory, recipe) -> PhaseGraph:
    """The view of the backward ``recipe`` would build, segmented (``segments.segment_backward``) or not."""
    return segmented_view(recipe, memory.shadows, memory.nodes[-1], memory.facts.inputs_of, memory.node_facts)


def _view(memory: JointMemory, inputs, order, outputs) -> PhaseGraph:
    output, inputs_of, facts = memory.nodes[-1], memory.facts.inputs_of, memory.node_facts
    return virtual_phase(inputs, order, outputs, output, inputs_of, facts)


def _simulate_pytorch_split(memory: JointMemory, values: list[fx.Node], symbols: list[fx.Node]) -> PeakEstimate:
    fw, bw = tp.split_with_saved_values(
        memory.joint,
        values,
        symbols,
        num_fwd_outputs=memory.num_fwd_outputs,
        static_lifetime_input_nodes=memory.static_inputs,
    )
    return simulate_step(fw, bw, memory.num_fwd_outputs, inputs=memory.simulator)
