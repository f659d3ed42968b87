"""estimate_peak: the liveness simulation of a *plan*, straight from the joint graph, without building its split.

A peak-aware search tries tens of plans; building each one's forward and backward graphs costs seconds on large
graphs (FX node copies, codegen), while this walk over plain integers costs milliseconds.  It follows the same
rules as ``liveness.simulate_step`` (read its docstring: allocation at the producing node, free after the last
reader of any alias, fusion of pointwise chains into their readers, in-place reuse of a dying same-size input), and
reproduces what the split does to the order:

* forward runs, in graph order, what the forward outputs and the saved values need;
* backward runs what the gradients need, stopping at saved values and tangents, in the order of PyTorch's
  ``reordering_to_mimic_autograd_engine``: walking the backward nodes from the first reader of a tangent, each one
  is preceded by those of its not-yet-run inputs (recomputed forward nodes) in graph order.  Recomputation is lazy,
  which is what makes checkpointing work.

What it leaves out of ``simulate_step``'s model: Inductor's kernel fusion *order* (a fused kernel runs at its earliest
member), in-place updates over saved inputs (and the rule that two readers in one kernel block them), the values
Inductor realizes although they would fuse away, and its buffer reuse; on the example models' frontier plans it is
within 5% of the simulation of the real split (test).  It ranks plans; an absolute peak budget is confirmed on the
real split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .costs import alias_root
from .layout import channels_last_copies, layout_optimised, workspace_bytes
from .liveness import (
    ALWAYS,
    FUSES_INTO,
    FUSIBLE_VALUE,
    _tensor_storage_bytes,
    inductor_class,
    storage_kind,
)
from .lowering import concat_kernel
from .ops import OpClass
from .roles import GraphRoles, Role

# Kernels that may write over a dying input of the same size (Inductor's in-place buffer reuse).
INPLACE_CLASSES = frozenset({OpClass.POINTWISE, OpClass.COPY})


@dataclass(frozen=True)
class JointMemory:
    """The joint graph as plain integers (node index = position in graph order)."""

    inputs: tuple[tuple[int, ...], ...]
    users: tuple[tuple[int, ...], ...]
    root: tuple[int, ...]  # the node owning the storage a node aliases
    nbytes: tuple[int, ...]  # bytes a node allocates when it materialises (its own storage)
    hold: tuple[int, ...]  # NEVER / ALWAYS / FUSIBLE_VALUE
    fuses_into: tuple[bool, ...]  # a fusible producer folds into this reader
    view_like: tuple[bool, ...]  # readers are looked through (views, items of tuples)
    inplace: tuple[bool, ...]  # may write into a dying input of the same size
    placeholder: tuple[bool, ...]
    tangent: tuple[bool, ...]
    is_copy: tuple[bool, ...]  # aten.copy_ (the reordering keeps these in place)
    forward_outputs: tuple[int, ...]
    gradients: tuple[int, ...]  # backward's outputs (gradients), as node indices
    # Inductor's layout optimisation (layout.py): channels-last copies of placeholders (node index -> bytes), made
    # when forward starts; per node, the most an op holds above what was live before it (mkldnn's convolution_backward
    # frees buffers before it returns)
    layout_copies: tuple[tuple[int, int], ...] = ()
    workspace: tuple[int, ...] = ()


def build_joint_memory(joint: fx.GraphModule, roles: GraphRoles, num_fwd_outputs: int) -> JointMemory:
    nodes = list(joint.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    classes = {n: inductor_class(n, c) for n, c in roles.op_class.items()}
    output = nodes[-1] if nodes[-1].op == "output" else next(n for n in reversed(nodes) if n.op == "output")
    returned = list(output.args[0])
    by_name = {n.name: n for n in nodes}
    channels_last = layout_optimised(joint)
    return JointMemory(
        inputs=tuple(tuple(index[a] for a in dict.fromkeys(n.all_input_nodes)) for n in nodes),
        users=tuple(tuple(index[u] for u in n.users) for n in nodes),
        root=tuple(index[alias_root(n, classes)] for n in nodes),
        nbytes=tuple(_tensor_storage_bytes(n) for n in nodes),
        hold=tuple(storage_kind(n, classes) for n in nodes),
        fuses_into=tuple(classes[n] in FUSES_INTO for n in nodes),
        view_like=tuple(classes[n] in (OpClass.VIEW, OpClass.GETITEM) for n in nodes),
        inplace=tuple(classes[n] in INPLACE_CLASSES and not concat_kernel(n) for n in nodes),  # as liveness
        placeholder=tuple(n.op == "placeholder" for n in nodes),
        tangent=tuple(roles.role[n] is Role.TANGENT for n in nodes),
        is_copy=tuple(n.op == "call_function" and n.target is torch.ops.aten.copy_.default for n in nodes),
        forward_outputs=tuple(index[a] for a in returned[:num_fwd_outputs] if isinstance(a, fx.Node)),
        gradients=tuple(index[a] for a in returned[num_fwd_outputs:] if isinstance(a, fx.Node)),
        layout_copies=tuple(sorted((index[by_name[name]], b) for name, b in channels_last_copies(joint).items())),
        workspace=tuple(_high_water(n, workspace_bytes(n, channels_last)) for n in nodes),
    )


def _high_water(node: fx.Node, workspace: int) -> int:
    """A multi-output op's items are separate nodes that allocate after it: the buffers it frees before returning
    sit on top of those items, so its high-water mark above what was live before it is both."""
    if not workspace:
        return 0
    items = [u for u in node.users if isinstance(u.meta.get("val"), torch.Tensor)]
    return workspace + sum(_tensor_storage_bytes(u) for u in items)


@dataclass(frozen=True)
class PlanPeak:
    activation_peak_bytes: int
    peak_bytes: int
    peak_phase: str
    peak_node: int  # node index


def _closure(memory: JointMemory, starts, stop: set[int]) -> set[int]:
    """Non-placeholder nodes reached from ``starts`` through inputs, not entering ``stop``."""
    seen: set[int] = set()
    stack = [s for s in starts if s not in stop]
    while stack:
        n = stack.pop()
        if n in seen or memory.placeholder[n]:
            continue
        seen.add(n)
        stack.extend(a for a in memory.inputs[n] if a not in stop and a not in seen)
    return seen


def _backward_order(memory: JointMemory, members: set[int]) -> list[int]:
    """PyTorch's reordering_to_mimic_autograd_engine, on node indices."""
    ordered = sorted(members)
    firsts = [n for n in ordered if any(memory.tangent[a] for a in memory.inputs[n])]
    if not firsts:
        return ordered
    first = firsts[0]
    done: set[int] = set()
    order: list[int] = []

    def insert(node: int) -> None:
        pending, stack = [], [node]
        while stack:
            n = stack.pop()
            if n in done or n not in members:
                continue
            done.add(n)
            pending.append(n)
            stack.extend(memory.inputs[n])
        order.extend(sorted(pending))

    for n in ordered:
        if n < first and memory.is_copy[n]:
            insert(n)
    for n in ordered:
        if n >= first:
            insert(n)
    for g in memory.gradients:  # the output node pulls in whatever is left (tangent-free gradients)
        insert(g)
    return order


class _Run:
    def __init__(self, memory: JointMemory, order: list[int], returned: set[int], keep: set[int], gradients: set[int]):
        self.memory, self.order, self.keep, self.gradients = memory, order, keep, gradients
        self.members = set(order)
        self.returned = returned | {memory.root[r] for r in returned}
        # A value fused into its readers is computed inside each of them: they, not it, read its inputs.
        self.fused_away = {n for n in order if memory.hold[n] == FUSIBLE_VALUE and not self.materialises(n)}
        reads: dict[int, set[int]] = {}
        self.last_use: dict[int, int] = {}
        for position, n in enumerate(order):
            effective: set[int] = set()
            for a in memory.inputs[n]:
                r = memory.root[a]
                effective |= reads.get(r, {r}) if r in self.fused_away else {r}
            if n in self.fused_away:
                reads[n] = effective
                continue
            for r in effective:
                self.last_use[r] = position

    def materialises(self, n: int) -> bool:
        m = self.memory
        if m.hold[n] != FUSIBLE_VALUE:
            return m.hold[n] == ALWAYS
        if n in self.returned:
            return True
        readers, stack = [], list(m.users[n])
        while stack:
            u = stack.pop()
            if u not in self.members:
                continue
            if m.view_like[u]:
                stack.extend(m.users[u])
            else:
                readers.append(u)
        return not readers or not all(m.fuses_into[u] for u in readers)  # as liveness.materialises

    def run(self, live: dict[int, int], phase: str, best: list) -> int:
        """Walk the order; ``best`` = [activation peak, peak, phase, node] is updated in place."""
        m = self.memory
        total = sum(live.values())
        grads = 0
        dies: dict[int, list[int]] = {}
        for root, position in self.last_use.items():
            dies.setdefault(position, []).append(root)
        for position, n in enumerate(self.order):
            if m.root[n] == n and not m.placeholder[n] and self.materialises(n):
                size = m.nbytes[n]
                if m.inplace[n]:
                    for a in m.inputs[n]:
                        r = m.root[a]
                        if live.get(r) == size and self.last_use.get(r) == position and r not in self.keep:
                            total -= live.pop(r)
                            if r in self.gradients:
                                grads -= size
                            break
                live[n] = live.get(n, 0) + size
                total += size
                if n in self.gradients:
                    grads += size
            during = total + (m.workspace[n] if m.workspace else 0)
            if during > best[1]:
                best[1:] = [during, phase, n]
            best[0] = max(best[0], during - grads)
            for r in dies.get(position, ()):
                if r in live and r not in self.keep:
                    total -= live.pop(r)
                    if r in self.gradients:
                        grads -= m.nbytes[r]
            if n in live and n not in self.keep and self.last_use.get(n, -1) < position:
                total -= live.pop(n)  # materialised, never read here, not kept: gone at once
        return total


def estimate_peak(memory: JointMemory, saved: set[int]) -> PlanPeak:
    """The simulated step of the plan that saves the nodes ``saved`` (node indices) for backward."""
    m = memory
    saved = set(saved)
    forward_nodes = _closure(m, [*m.forward_outputs, *saved], set())
    forward_order = sorted(forward_nodes)
    saved_roots = {m.root[s] for s in saved}
    user_roots = {m.root[o] for o in m.forward_outputs}
    best = [0, 0, "forward", -1]
    gradient_roots = {m.root[g] for g in m.gradients}
    backward_nodes = _closure(m, m.gradients, saved)
    # a placeholder backward reads is saved; a channels-last copy of it is what forward hands over
    copies = dict(m.layout_copies)
    saved_copies = {p for p in copies if any(p in m.inputs[n] for n in backward_nodes)}
    forward = _Run(m, forward_order, set(m.forward_outputs) | saved, saved_roots | user_roots | saved_copies, set())
    live: dict[int, int] = dict(copies)
    forward.run(live, "forward", best)
    carried = {r: live[r] for r in saved_roots | saved_copies if r in live}
    tangents = [i for i, t in enumerate(m.tangent) if t and m.nbytes[i]]
    for t in tangents:
        carried[t] = m.nbytes[t]
    backward = _Run(m, _backward_order(m, backward_nodes), set(m.gradients), gradient_roots, gradient_roots)
    backward.run(carried, "backward", best)
    return PlanPeak(activation_peak_bytes=best[0], peak_bytes=best[1], peak_phase=best[2], peak_node=best[3])
