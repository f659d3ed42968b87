"""simulate_step: the memory a training step holds over time, for a (forward, backward) split, without running it.

What it models (all in one place, so the rule can be checked against measurements — benchmarks/peak_memory.py):
* Peak means bytes allocated during the step above what was live at its start (parameters, buffers and inputs
  are not counted; gradients are, since they are allocated during backward and outlive it).
* Forward runs its nodes in graph order; backward in graph order too (PyTorch's split already reorders it the way
  the autograd engine would run it).  A node allocates its output's storage when it runs; a storage is freed
  right after the last node that reads it or any alias of it.  Views (and items of view tuples) allocate nothing.
* What forward returns stays alive: saved values until their last use in backward, other outputs until forward
  ends (the caller drops them: ``model(x).sum().backward()`` keeps only the loss).  Backward's outputs (gradients)
  stay alive to the end.  Tangents are allocated when backward starts.
* Fusion: a pointwise/copy/creation value whose every reader is one Inductor fuses it into (pointwise, copy,
  reduction, norm, view) never leaves its kernel, so it allocates nothing (``materialises``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .costs import alias_root, value_nbytes
from .ops import FUSIBLE, OpClass, op_class

# Readers a fusible producer folds into (Inductor's pointwise fusion, reduction prologues); views are looked through.
# Kernels Inductor may run in place over a dying input of the same size (pointwise ones).
INPLACE_CLASSES = frozenset({OpClass.POINTWISE, OpClass.COPY})
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
    timeline: tuple[tuple[str, str, int], ...]  # (phase, node, bytes live after it)


def materialises(node: fx.Node, classes: dict[fx.Node, OpClass], outputs: set[fx.Node]) -> bool:
    cls = classes[node]
    if cls is OpClass.GETITEM:
        # an item of a multi-output op (SDPA, var_mean) owns its storage; an item of a view tuple (split) does not
        parent = node.args[0]
        return classes.get(parent) is not OpClass.VIEW and isinstance(node.meta.get("val"), torch.Tensor)
    if isinstance(node.meta.get("val"), (tuple, list)):
        return False  # the tuple itself holds nothing: its items are allocated (above)
    if cls in (OpClass.VIEW, OpClass.SYMBOLIC, OpClass.PLACEHOLDER, OpClass.OUTPUT):
        return False
    if cls is OpClass.MUTATION:
        return False  # writes into an existing storage (e.g. BatchNorm's running stats)
    if node in outputs:
        return True
    readers = _readers_through_views(node, classes)
    if cls in FUSIBLE and readers and all(classes[u] in FUSES_INTO for u in readers) and not readers & outputs:
        return False
    return True


def _readers_through_views(node: fx.Node, classes: dict[fx.Node, OpClass]) -> set[fx.Node]:
    """The nodes that read ``node``'s data, looking through views of it (a view fuses nothing by itself)."""
    readers: set[fx.Node] = set()
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if classes.get(user) in (OpClass.VIEW, OpClass.GETITEM):
            stack.extend(user.users)
        else:
            readers.add(user)
    return readers


def _tensor_storage_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return value_nbytes(val) if isinstance(val, torch.Tensor) else 0


class _Phase:
    """Live storages of one graph run: root node name -> bytes."""

    def __init__(self, graph: fx.Graph, keep: set[str], carried: dict[str, int], gradients: frozenset = frozenset()):
        self.nodes = list(graph.nodes)
        self.classes = {n: op_class(n) for n in self.nodes}
        self.output = next(n for n in reversed(self.nodes) if n.op == "output")
        self.roots = {n: alias_root(n, self.classes) for n in self.nodes}
        # a returned view keeps its base: the base must be materialised even if it would otherwise fuse away
        self.returned = {a for a in self.output.all_input_nodes} | {self.roots[a] for a in self.output.all_input_nodes}
        self.last_use: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            for arg in node.all_input_nodes:
                self.last_use[self.roots[arg].name] = index
        self.keep = keep  # root names that outlive this graph
        self.gradients = gradients  # root names that are gradients (not activations)
        self.activation_peak = 0
        self.live = dict(carried)

    def _inplace_candidate(self, node: fx.Node, index: int, nbytes: int) -> str | None:
        """An input storage of the same size whose last reader is this pointwise kernel (Inductor's in-place
        buffer reuse), or None."""
        if self.classes[node] not in INPLACE_CLASSES:
            return None
        for arg in node.all_input_nodes:
            name = self.roots[arg].name
            if (
                self.live.get(name) == nbytes
                and self.last_use.get(name) == index
                and name not in self.keep
                and self.roots[arg].op != "placeholder"
            ):
                return name
        return None

    def run(self, phase: str, timeline: list) -> int:
        """One pass over the nodes with running totals: a storage is freed at the end of the step of its last
        reader (or of its own step, if nothing reads it), unless it outlives the graph (``keep``)."""
        live, keep, gradients = self.live, self.keep, self.gradients
        total = sum(live.values())
        gradient_total = sum(b for name, b in live.items() if name in gradients)
        due: dict[int, list[str]] = {}

        def schedule(name: str, step: int) -> None:
            if name not in keep:
                due.setdefault(max(step, self.last_use.get(name, -1)), []).append(name)

        for name in live:
            schedule(name, 0)
        peak = total
        for index, node in enumerate(self.nodes):
            if node.op == "output":
                break
            root = self.roots[node]
            if root is node and node.op != "placeholder" and materialises(node, self.classes, self.returned):
                nbytes = _tensor_storage_bytes(node)
                reused = self._inplace_candidate(node, index, nbytes)
                if reused is not None:
                    freed = live.pop(reused)  # Inductor writes the result into an input buffer that dies here
                    total -= freed
                    if reused in gradients:
                        gradient_total -= freed
                if node.name not in live:
                    schedule(node.name, index)
                live[node.name] = live.get(node.name, 0) + nbytes
                total += nbytes
                if node.name in gradients:
                    gradient_total += nbytes
            peak = max(peak, total)
            timeline.append((phase, node.name, total))
            self.activation_peak = max(self.activation_peak, total - gradient_total)
            for name in due.pop(index, ()):
                freed = live.pop(name, None)
                if freed is not None:
                    total -= freed
                    if name in gradients:
                        gradient_total -= freed
        return peak


def simulate_step(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> PeakEstimate:
    timeline: list[tuple[str, str, int]] = []
    fw_output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    fw_returns = [a for a in fw_output.args[0] if isinstance(a, fx.Node)]
    saved = fw_returns[num_fwd_outputs:]
    fw_classes = {n: op_class(n) for n in fw.graph.nodes}
    saved_roots = {alias_root(n, fw_classes).name for n in saved}
    user_roots = {alias_root(n, fw_classes).name for n in fw_returns[:num_fwd_outputs]}
    forward = _Phase(fw.graph, keep=saved_roots | user_roots, carried={})
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
    backward = _Phase(bw.graph, keep=gradients, carried=carried, gradients=frozenset(gradients))
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
