"""The loss region run in chunks along the tokens, its gradients computed in forward (docs/DESIGN.md §14).

For each chunk of ``c`` tokens the forward computes the chunk's logits (``c × vocabulary``), its loss, and the
gradient of the loss with respect to the chunk's hidden states, the head's weight (accumulated) and its bias; the
chunk's logits, softmax and logits' gradient die inside the chunk.  Backward only scales those gradients by the
loss's incoming gradient: exact, since the cross-entropy's gradients are linear in it, and no matmul runs twice (the
way fused linear-cross-entropy kernels avoid the extra matmul).  The joint graph is rewritten before the cut, so the
cut prices what the chunked gradients cost to keep like any other value.

Applies where the logits are read nowhere else (the compiled function returns the loss, not the logits) and the
backward is the plain one ``loss_region`` knows; elsewhere the graph is left as it came.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..graph.costs import hinted_shape
from ..graph.cse import plan_clean_up
from ..graph.loss_region import LossRegion, find_loss_regions
from ..graph.ops import CHUNK_OPS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkedLoss:
    """What the rewrite did to one loss region."""

    projection: str  # the LM head's node
    tokens: int  # the logits' shape, symbolic sizes at their hints
    vocab: int
    chunks: int
    rewritten: bool
    why_not: str | None = None  # set where ``rewritten`` is False

    @property
    def row(self) -> tuple[str, int, int, int, str | None]:
        """The report's row (``LossRegions.loss_regions``): chunks 0 where left as traced."""
        return (self.projection, self.tokens, self.vocab, self.chunks if self.rewritten else 0, self.why_not)


def report_row(region: LossRegion, why: str | None = None) -> tuple[str, int, int, int, str | None]:
    """The report's row of a region left as traced, ``why`` (symbolic sizes at their hints: a report is plain data)."""
    tokens, vocab = hinted_shape(region.projection)
    return (region.projection.name, tokens, vocab, 0, why)


class _Emitter:
    """Inserts nodes before one anchor, each with its fake value (the passes after this one read ``meta["val"]``)."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, fake_mode):
        self.graph, self.anchor, self.fake_mode, self.made = graph, anchor, fake_mode, []

    def __call__(self, op: str, *args, **kwargs) -> fx.Node:
        target = CHUNK_OPS[op]
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args, kwargs)
        self.made.append(node)

        def val(a):
            return a.meta["val"] if isinstance(a, fx.Node) else [val(x) for x in a] if isinstance(a, list) else a

        with self.fake_mode:
            node.meta["val"] = target(*(val(a) for a in args), **{k: val(v) for k, v in kwargs.items()})
        return node


def why_not_chunked(region: LossRegion) -> str | None:
    """Why the rewrite does not apply to ``region``, or None where it does."""
    if region.logits_returned:
        return "the logits are read outside the loss region (returned, or used by another op)"
    if region.backward is None:
        return "its backward is not the plain cross-entropy backward"
    if getattr(region.hidden.meta.get("val"), "fake_mode", None) is None:
        return "its values carry no fake tensors"
    if not all(isinstance(size, int) for size in region.projection.meta["val"].shape):
        # the chunks' bounds are the graph's constants: written for one size, they would be wrong at another
        return "its token count is symbolic (dynamic shapes; compile with dynamic=False to chunk it)"
    if region.tokens < 2:
        return "fewer than two tokens"
    return None


def chunk_loss_regions(joint: fx.GraphModule, chunks: int) -> list[ChunkedLoss]:
    """Rewrite every loss region of ``joint`` that can be (``why_not_chunked``) into ``chunks`` chunks, in place."""
    done = []
    for region in find_loss_regions(joint.graph):
        why = why_not_chunked(region)
        tokens, vocab = hinted_shape(region.projection)
        k = min(chunks, tokens)
        if why is None:
            _rewrite(joint.graph, region, k)
        done.append(ChunkedLoss(region.projection.name, tokens, vocab, k, why is None, why))
        log.debug("loss region %s: %d tokens x %d, %s", region.projection.name, tokens, vocab, why or k)
    return done


def _rewrite(graph: fx.Graph, region: LossRegion, chunks: int) -> None:
    emit = _Emitter(graph, region.loss, region.hidden.meta["val"].fake_mode)  # after every input
    try:
        loss, grads = _chunked_forward(emit, region, chunks)
    except Exception:
        for node in reversed(emit.made):  # the graph as it came: nothing reads the nodes made so far
            graph.erase_node(node)
        raise
    _scale_in_backward(graph, region, grads)
    region.loss.replace_all_uses_with(loss)
    # the old region, read by nothing now, and what only it read: dead code elimination as prepare_joint_graph does
    # it (random ops kept, so the step draws the same random numbers)
    plan_clean_up(graph, cse=False).apply()


def _denominator(emit: _Emitter, region: LossRegion, valid: fx.Node) -> fx.Node | None:
    """The mean's divisor, the tokens not ignored (nll_loss's ``total_weight``); None for a sum."""
    if region.reduction == "sum":
        return None
    return emit("sum", valid, dtype=region.compute_dtype)


def _chunked_forward(emit: _Emitter, region: LossRegion, chunks: int):
    """(the loss, {gradient name: its value in forward}), the chunks one after another in graph order."""
    dtype, size = region.compute_dtype, -(-region.tokens // chunks)
    valid = emit("ne", region.target, region.ignore_index)
    denominator = _denominator(emit, region, valid)
    head = emit("permute", region.weight, [1, 0])  # [vocab, hidden]
    device = region.hidden.meta["val"].device
    classes = emit(
        "view",
        emit(
            "iota",
            region.vocab,
            start=0,
            step=1,
            dtype=region.target.meta["val"].dtype,
            device=device,
            requires_grad=False,
        ),
        [1, region.vocab],
    )
    total, hidden_grads, weight_grad, bias_grad = None, [], None, None
    for start in range(0, region.tokens, size):
        stop = min(start + size, region.tokens)
        after = None if weight_grad is None else (hidden_grads[-1], weight_grad)
        part = _chunk(emit, region, (head, classes, valid, denominator), start, stop, after)
        total = part["loss"] if total is None else emit("add", total, part["loss"])
        hidden_grads.append(part["hidden"])
        weight_grad = _accumulate(emit, weight_grad, part["weight"], dtype)
        if region.bias is not None:
            bias_grad = _accumulate(emit, bias_grad, part["bias"], dtype)
    loss = total if denominator is None else emit("div", total, denominator)
    if loss.meta["val"].dtype != dtype:
        loss = emit("to", loss, dtype)
    projected = region.projection.meta["val"].dtype
    weight_grad, bias_grad = (_narrowed(emit, g, projected) for g in (weight_grad, bias_grad))
    grads = {"hidden": emit("cat", hidden_grads), "weight": weight_grad, "bias": bias_grad}
    return loss, grads


def _accumulate(emit: _Emitter, total: fx.Node | None, part: fx.Node, dtype: torch.dtype) -> fx.Node:
    """``total + part``, summed in ``dtype`` (the loss's compute dtype) where the parts are narrower: the traced
    graph's one matmul over every token accumulates in fp32 and rounds once to bf16; the chunks' sum rounds each
    chunk's part once and adds them in fp32, so no rounding grows with the count (docs/DESIGN.md §14)."""
    if total is None:
        return part
    if part.meta["val"].dtype != dtype:
        part = emit("to", part, dtype)
    if total.meta["val"].dtype != dtype:
        total = emit("to", total, dtype)
    return emit("add", total, part)


def _narrowed(emit: _Emitter, value: fx.Node | None, dtype: torch.dtype) -> fx.Node | None:
    """``value`` in the projection's dtype (the traced gradient's), where the accumulation widened it."""
    if value is None or value.meta["val"].dtype == dtype:
        return value
    return emit("to", value, dtype)


def _after(emit: _Emitter, value: fx.Node, previous: tuple[fx.Node, ...]) -> fx.Node:
    """``value`` plus an exact zero read from each of ``previous``: the chunk's logits wait for the previous chunk's
    gradients, so that no scheduler runs two chunks' full-width values at once (docs/DESIGN.md §14).  The zero is an
    integer product (``(x == x) * 0``, exact whatever ``x`` holds, NaN included) turned into ``value``'s dtype."""
    zero = None
    for node in previous:
        corner = emit("slice", emit("slice", node, 0, 0, 1), 1, 0, 1)  # [1, 1]
        term = emit("mul", emit("to", emit("eq", corner, corner), torch.int32), 0)
        zero = term if zero is None else emit("add", zero, term)
    return emit("add", value, emit("to", zero, value.meta["val"].dtype))


def _chunk(emit: _Emitter, region: LossRegion, shared, start: int, stop: int, after) -> dict:
    """One chunk's loss (the sum over its tokens) and its gradients, the mean's division folded in; its logits
    computed ``_after`` the previous chunk's gradients (``after``, None for the first).  Written in the ops Inductor's
    decompositions leave (amax, exp, log, gather, where), so that Inductor lowers and fuses them as it would the
    traced loss."""
    head, classes, valid, denominator = shared
    dtype = region.compute_dtype
    hidden = emit("slice", region.hidden, 0, start, stop)
    hidden = hidden if after is None else _after(emit, hidden, after)
    valid = emit("slice", valid, 0, start, stop)
    target = emit("unsqueeze", emit("mul", emit("slice", region.target, 0, start, stop), valid), 1)  # 0 where ignored
    if region.bias is None:
        logits = emit("mm", hidden, region.weight)
    else:
        logits = emit("addmm", region.bias, hidden, region.weight)
    projected_dtype = logits.meta["val"].dtype
    if projected_dtype != dtype:
        logits = emit("to", logits, dtype)
    peak = emit("amax", logits, [1], True)
    lse = emit("add", emit("log", emit("sum_dims", emit("exp", emit("sub", logits, peak)), [1], True)), peak)
    weight = emit("unsqueeze", emit("to", valid, dtype), 1)  # 0 where ignored
    picked = emit("gather", logits, 1, target)
    loss = emit("sum", emit("mul", emit("sub", lse, picked), weight))
    if denominator is not None:
        weight = emit("div", weight, denominator)
    softmax = emit("exp", emit("sub", logits, lse))
    one_hot = emit("eq", classes, target)
    grad = emit("mul", emit("where", one_hot, emit("sub", softmax, 1.0), softmax), weight)  # d loss / d logits
    if grad.meta["val"].dtype != projected_dtype:
        grad = emit("to", grad, projected_dtype)
    part = {"loss": loss, "hidden": emit("mm", grad, head), "weight": emit("mm", emit("permute", grad, [1, 0]), hidden)}
    if region.bias is not None:
        part["bias"] = emit("sum_dims", grad, [0])
    return part


def _scale_in_backward(graph: fx.Graph, region: LossRegion, grads: dict) -> None:
    """Each exit of the region's backward replaced by its gradient from forward times the loss's incoming gradient."""
    bw = region.backward
    for exit_node, name in ((bw.grad_hidden, "hidden"), (bw.grad_weight, "weight"), (bw.grad_bias, "bias")):
        if exit_node is None:
            continue
        emit = _Emitter(graph, exit_node, region.hidden.meta["val"].fake_mode)
        value = grads[name]
        if name == "weight" and not bw.grad_weight_transposed:
            value = emit("permute", value, [1, 0])  # [hidden, vocab], the projection's right operand's own layout
        scaled = emit("mul", value, bw.scale)
        if tuple(scaled.meta["val"].shape) != tuple(exit_node.meta["val"].shape):
            scaled = emit("view", scaled, list(exit_node.meta["val"].shape))
        exit_node.replace_all_uses_with(scaled)
