"""classify: the role of every node of a joint forward+backward graph, what backward needs, and what may never be
recomputed (and why).  It reads the graph through its ``graph_facts.GraphFacts`` (op classes, inputs, outputs,
placeholder kinds, alias roots), which ``GraphRoles.facts`` hands on to the later passes.  Placeholder roles come
from AOTAutograd's own name predicates (``_torch_private``), which the split (``split.py``) uses too."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .. import _torch_private as tp
from .graph_facts import GraphFacts, graph_facts
from .ops import NEVER_RECOMPUTE_REASONS, OpClass

log = logging.getLogger(__name__)

Policy = tp.CheckpointPolicy


class Role(enum.Enum):
    INPUT = "input"  # primals and forward RNG seeds/offsets: exist in forward, alive anyway
    TANGENT = "tangent"  # tangents and backward RNG seeds: backward's own inputs
    FORWARD = "forward"  # needed to compute the forward outputs
    BACKWARD = "backward"  # depends on a tangent (or is tagged for backward): runs in backward, period
    BACKWARD_ONLY = "backward_only"  # tangent-free, but only backward uses it: runs once, in either graph
    OUTPUT = "output"


@dataclass(frozen=True)
class GraphRoles:
    """Roles of one joint graph.

    ``needed``: the non-backward nodes that backward reads directly (plus tangent-free gradients), in graph order.
    ``no_recompute``: node -> why it may never be recomputed.  ``no_save``: node -> why it may never be saved.
    ``tag_conflicts``: node -> what a user tag asked that a safety rule overrode.  ``facts``: the graph's facts
    (``graph_facts.py``), for the passes after this one.
    """

    role: dict[fx.Node, Role]
    needed: tuple[fx.Node, ...]
    static_inputs: frozenset[fx.Node]
    no_recompute: dict[fx.Node, str]
    no_save: dict[fx.Node, str]
    tag_conflicts: dict[fx.Node, str]
    facts: GraphFacts | None = field(default=None, compare=False)

    def nodes_with(self, *roles: Role) -> list[fx.Node]:
        return [n for n, r in self.role.items() if r in roles]

    @property
    def has_backward(self) -> bool:
        return bool(self.needed)


def recompute_tag(node: fx.Node):
    return node.meta.get("recompute")


def _never_recompute_reason(node: fx.Node, cls: OpClass, role: Role) -> str | None:
    if role is Role.INPUT:
        return "graph input"
    if cls in NEVER_RECOMPUTE_REASONS:
        return NEVER_RECOMPUTE_REASONS[cls]
    if tp.must_be_in_forward(node):
        return "tagged to run in forward"
    if recompute_tag(node) == Policy.MUST_SAVE:
        return "tagged MUST_SAVE (by the user or by PyTorch's safety marks)"
    if recompute_tag(node) == Policy.MUST_CPU_OFFLOAD:  # saved, as PyTorch saves it; not offloaded (DESIGN §16)
        return "tagged MUST_CPU_OFFLOAD: saved (fxremat does not offload tagged values yet)"
    return None


def _value_cannot_be_saved(node: fx.Node) -> str | None:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        return "multi-output node: its items are saved instead"
    if val is None and "val" not in node.meta:
        return "no value metadata"
    if isinstance(val, torch.SymFloat):
        return "SymFloat"
    if val is not None and not isinstance(val, (torch.Tensor, torch.SymInt, int, bool)):
        return f"non-tensor value ({type(val).__name__})"
    return None


def must_recompute_values(facts: GraphFacts, role: dict[fx.Node, Role]) -> dict[fx.Node, str]:
    """The values a MUST_RECOMPUTE tag forbids saving, in graph order, each with the reason (docs/DESIGN.md §2).

    The tag holds per storage: the tagged value, every value sharing its storage (a view of it *is* it; graph
    inputs' storages excepted, they stay alive anyway), and the items of a tagged multi-output node.  It also
    covers the backward-only values computed from those (``cos(mm)`` for ``sin(mm)``'s gradient): they are parts
    of autograd's backward formulas, which eager runs in backward, so computing one early in forward and saving it
    would keep the tagged value's data under another name.  A forward value computed from a tagged one follows
    its own tag, as in PyTorch."""
    nodes, classes, inputs_of, alias_root = facts.nodes, facts.op_class, facts.inputs_of, facts.alias_root
    tagged = [
        n for n in nodes if role[n] in (Role.FORWARD, Role.BACKWARD_ONLY) and recompute_tag(n) == Policy.MUST_RECOMPUTE
    ]
    if not tagged:
        return {}  # every rule below starts from a tagged value (most graphs have none: skip the walk)
    roots = {}
    for node in tagged:
        root = alias_root[node]
        if root.op != "placeholder":
            roots.setdefault(root, node)
    out: dict[fx.Node, str] = {}
    for node in nodes:
        r = role[node]
        if r not in (Role.FORWARD, Role.BACKWARD_ONLY):
            continue
        root = alias_root[node]
        if recompute_tag(node) == Policy.MUST_RECOMPUTE:
            out[node] = "tagged MUST_RECOMPUTE"
        elif root in roots:
            out[node] = f"shares the storage of {roots[root].name}, tagged MUST_RECOMPUTE"
        elif classes[node] is OpClass.GETITEM and node.args[0] in out:
            out[node] = f"an item of {node.args[0].name}, tagged MUST_RECOMPUTE"
        elif r is Role.BACKWARD_ONLY:
            source = next((a for a in inputs_of[node] if a in out), None)
            if source is not None:
                out[node] = f"backward-only, computed from {source.name} (MUST_RECOMPUTE)"
    return out


def classify(
    joint: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: list[int] | None,
    facts: GraphFacts | None = None,
) -> GraphRoles:
    """The roles of ``joint``'s nodes; ``facts``: its ``GraphFacts`` (by default those ``graph_facts`` finds)."""
    start = time.perf_counter()
    facts = facts if facts is not None else graph_facts(joint, num_fwd_outputs)
    nodes, classes, inputs_of = facts.nodes, facts.op_class, facts.inputs_of
    backward = _backward_nodes(facts)
    forward = _ancestors(facts.fwd_outputs, inputs_of.__getitem__)
    role = _assign_roles(facts, forward, backward)
    needed = _needed_by_backward(nodes, role, inputs_of, facts.bwd_outputs)
    primals = facts.primals
    static = frozenset(primals[i] for i in (static_lifetime_input_indices or []) if i < len(primals))
    reads_mutated = _reads_mutated_inputs(nodes, role, classes, inputs_of, tp.mutated_inputs(nodes, facts.fwd_descs))
    no_recompute, no_save = _recompute_and_save_limits(nodes, role, classes, reads_mutated)
    conflicts = _apply_must_recompute(facts, role, no_recompute, no_save)
    result = GraphRoles(
        role=role,
        needed=tuple(sorted(needed, key=facts.index.__getitem__)),
        static_inputs=static,
        no_recompute=no_recompute,
        no_save=no_save,
        tag_conflicts=conflicts,
        facts=facts,
    )
    log.debug(
        "classify: %d nodes, %d forward, %d backward, %d needed by backward, %d never recomputed, %.4fs",
        len(nodes),
        len(forward),
        len(backward),
        len(needed),
        len(no_recompute),
        time.perf_counter() - start,
    )
    return result


def _backward_nodes(facts: GraphFacts) -> set[fx.Node]:
    """Everything downstream of a tangent (or a backward seed) or of a node tagged for backward."""
    backward: set[fx.Node] = set(facts.backward_inputs)
    inputs_of = facts.inputs_of
    for node in facts.nodes:
        if node.op != "output" and (not backward.isdisjoint(inputs_of[node]) or tp.must_be_in_backward(node)):
            backward.add(node)
    return backward


def _ancestors(outputs, inputs_of: Callable[[fx.Node], list[fx.Node]]) -> set[fx.Node]:
    """The nodes ``outputs`` are computed from, themselves included (forward: PyTorch's ``is_required_fw``)."""
    found: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(inputs_of(node))
    return found


def _assign_roles(facts: GraphFacts, forward: set[fx.Node], backward: set[fx.Node]) -> dict[fx.Node, Role]:
    """AOTAutograd recognises placeholder roles by name, and so do we, with its own predicates (``graph_facts``:
    keep AOTAutograd's placeholder names): tangents and backward seeds are backward's inputs, the rest (primals,
    forward seeds) forward's."""
    role: dict[fx.Node, Role] = {}
    for node in facts.nodes:
        if node.op == "output":
            role[node] = Role.OUTPUT
        elif node.op == "placeholder":
            role[node] = Role.TANGENT if node in facts.backward_inputs else Role.INPUT
        elif node in backward:
            role[node] = Role.BACKWARD
        elif node in forward:
            role[node] = Role.FORWARD
        else:
            role[node] = Role.BACKWARD_ONLY
    return role


def _needed_by_backward(nodes, role, inputs_of, bwd_outputs) -> set[fx.Node]:
    """The non-backward values backward reads, and the gradients computed without a tangent."""
    needed: set[fx.Node] = set()
    for node in nodes:
        if role[node] is Role.BACKWARD:
            needed.update(a for a in inputs_of[node] if role[a] not in (Role.BACKWARD, Role.TANGENT))
    for out in bwd_outputs:
        if isinstance(out, fx.Node) and role[out] not in (Role.BACKWARD, Role.TANGENT):
            needed.add(out)
    return needed


def _reads_mutated_inputs(nodes, role, classes, inputs_of, mutated) -> set[fx.Node]:
    """A value computed in backward from a graph input that forward mutates in place would read the new value
    (BatchNorm's running stats): such readers (through views too) stay in forward and are saved, as PyTorch's
    partitioner does."""
    reads_mutated: set[fx.Node] = set()
    for node in nodes:
        if role.get(node) is Role.FORWARD and any(
            a in mutated or a in reads_mutated and classes[a] is OpClass.VIEW for a in inputs_of[node]
        ):
            reads_mutated.add(node)
    return reads_mutated


def _recompute_and_save_limits(nodes, role, classes, reads_mutated) -> tuple[dict[fx.Node, str], dict[fx.Node, str]]:
    """(node -> why it may never be recomputed, node -> why it may never be saved), before MUST_RECOMPUTE tags."""
    no_recompute: dict[fx.Node, str] = {}
    no_save: dict[fx.Node, str] = {}
    for node in nodes:
        r = role[node]
        if r in (Role.OUTPUT, Role.BACKWARD, Role.TANGENT):
            continue
        reason = _never_recompute_reason(node, classes[node], r)
        if reason is None and node in reads_mutated:
            reason = "reads a graph input that forward mutates in place"
        if r is Role.BACKWARD_ONLY and reason is not None and not tp.must_be_in_forward(node):
            reason = None  # it runs once either way; computing it in backward is not a recompute
        if reason is not None:
            no_recompute[node] = reason
        cannot_save = _value_cannot_be_saved(node)
        if cannot_save is not None:
            no_save[node] = cannot_save
    return no_recompute, no_save


def _apply_must_recompute(facts: GraphFacts, role, no_recompute, no_save) -> dict[fx.Node, str]:
    """Adds the MUST_RECOMPUTE tags' values to ``no_save`` (in place) and returns node -> the tag a safety rule
    overrode.  A MUST_RECOMPUTE value that cannot be recomputed after all (it reads, perhaps through other tagged
    values, a value that may be neither saved nor recomputed: the items of a never-recomputed random op) keeps its
    data by being saved: safety wins over the tag, and the report says so."""
    conflicts: dict[fx.Node, str] = {}
    unsaveable = must_recompute_values(facts, role)
    if not unsaveable:
        return conflicts  # the walk below only decides about these values
    nodes, inputs_of = facts.nodes, facts.inputs_of
    for node, why in unsaveable.items():
        if node in no_recompute:
            conflicts[node] = f"{why}, but never recomputed: {no_recompute[node]}"
        elif node not in no_save:
            no_save[node] = why
    recomputable: dict[fx.Node, bool] = {}
    for node in nodes:
        if role[node] in (Role.OUTPUT, Role.BACKWARD, Role.TANGENT):
            continue
        recomputable[node] = (
            node not in no_recompute
            and role[node] is not Role.INPUT
            and all(a not in no_save or recomputable.get(a, False) for a in inputs_of[node])
        )
        why = unsaveable.get(node)
        if why is not None and no_save.get(node) == why and not recomputable[node]:
            del no_save[node]
            conflicts[node] = f"{why}, but it reads a value that is never recomputed nor saved: saved"
    return conflicts


def forward_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> set[fx.Node]:
    """Ancestors of the forward outputs (PyTorch's ``is_required_fw``)."""
    fwd_outputs, _ = tp.extract_fwd_bwd_outputs(joint, num_fwd_outputs)
    return _ancestors(fwd_outputs, lambda node: node.all_input_nodes)
