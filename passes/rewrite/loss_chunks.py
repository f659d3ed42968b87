"""The loss region run in chunks along the tokens, its gradients computed in forward (docs/DESIGN.md §14).

For each chunk of ``c`` tokens the forward computes the chunk's logits (``c × vocabulary``), its loss, and the
gradient of the loss with respect to the chunk's hidden states, the head's weight (accumulated) and its bias; the
chunk's logits, softmax and logits' gradient die inside the chunk.  Backward only scales those gradients by the
loss's incoming gradient: exact, since the cross-entropy's gradients are linear in it, and no matmul runs twice (the
way fused linear-cross-entropy kernels avoid the extra matmul).  The joint graph is rewritten before the cut, so the
cut prices what the chunked gradients cost to keep like any other value.

Where the logits are returned (``model(x, labels=y)`` returns them beside the loss), they exist whole anyway and
the autograd engine hands backward a gradient for them (a zero tensor where the caller uses them for nothing): the
forward computes the loss chunk by chunk from slices of the logits, keeping each token's log-sum-exp, and backward
computes each chunk's logits' gradient from them, adds the tangent's slice and runs the chunk's part of the head's
two matmuls (``BACKWARD``: no matmul runs twice either).  Applies where the backward is the plain one
``loss_region`` knows; elsewhere the graph is left as it came.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..graph.costs import hinted_shape
from ..graph.cse import plan_clean_up
from ..graph.loss_region import LossRegion, find_loss_regions
from ..graph.ops import ADD, CHUNK_OPS, FULL, LOGITS_PASSTHROUGH, TRANSPOSES

MASKED_PUT = CHUNK_OPS["_unsafe_masked_index_put_accumulate"]  # Inductor's embedding_dense_backward
# the scatter-adds Inductor decomposes embedding_dense_backward into (torch 2.11: ``index_put`` accumulating), by
# their names among ``CHUNK_OPS``
EMBEDDING_SCATTERS = {MASKED_PUT: "_unsafe_masked_index_put_accumulate", CHUNK_OPS["index_put"]: "index_put"}

log = logging.getLogger(__name__)

FORWARD = "forward"  # the gradients computed in forward, chunk by chunk, scaled in backward
BACKWARD = "backward"  # the logits returned: the loss chunked in forward, the gradients chunked in backward
RECOMPUTED = "backward, logits recomputed"  # BACKWARD, each slice's logits recomputed in backward (budgets only)


@dataclass(frozen=True)
class ChunkedLoss:
    """What the rewrite did to one loss region."""

    projection: str  # the LM head's node
    tokens: int  # the logits' shape, symbolic sizes at their hints
    vocab: int
    chunks: int
    rewritten: bool
    why_not: str | None = None  # set where ``rewritten`` is False
    form: str | None = None  # FORWARD or BACKWARD where rewritten

    @property
    def row(self) -> tuple[str, int, int, int, str | None, str | None]:
        """The report's row (``LossRegions.loss_regions``): chunks 0 where left as traced."""
        chunks = self.chunks if self.rewritten else 0
        return (self.projection, self.tokens, self.vocab, chunks, self.why_not, self.form if self.rewritten else None)


def report_row(region: LossRegion, why: str | None = None) -> tuple[str, int, int, int, str | None, None]:
    """The report's row of a region left as traced, ``why`` (symbolic sizes at their hints: a report is plain data)."""
    tokens, vocab = hinted_shape(region.projection)
    return (region.projection.name, tokens, vocab, 0, why, None)


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


def chunk_loss_regions(joint: fx.GraphModule, chunks: int, recompute: bool = False) -> list[ChunkedLoss]:
    """Rewrite every loss region of ``joint`` that can be (``why_not_chunked``) into ``chunks`` chunks, in place;
    ``recompute``: where the logits are returned, backward recomputes each slice's logits rather than reading the
    returned ones (one more matmul of the head: for budgets, docs/DESIGN.md §14)."""
    done = []
    for region in find_loss_regions(joint.graph):
        why = why_not_chunked(region)
        tokens, vocab = hinted_shape(region.projection)
        k = min(chunks, tokens)
        form = None if why is not None else form_of(region)
        form = RECOMPUTED if recompute and form == BACKWARD else form
        if why is None:
            _rewrite(joint.graph, region, k, form == RECOMPUTED)
        done.append(ChunkedLoss(region.projection.name, tokens, vocab, k, why is None, why, form))
        log.debug("loss region %s: %d tokens x %d, %s", region.projection.name, tokens, vocab, why or k)
    return done


def _rewrite(graph: fx.Graph, region: LossRegion, chunks: int, recompute: bool) -> None:
    fake_mode = region.hidden.meta["val"].fake_mode
    emitters = [_Emitter(graph, region.loss, fake_mode)]  # after every input
    try:
        if form_of(region) == FORWARD:
            loss, grads = _chunked_forward(emitters[0], region, chunks)
        else:
            loss, shared, lse = _chunked_loss(emitters[0], region, chunks)
            emitters.append(_Emitter(graph, _first_exit(graph, region), fake_mode))
            grads = _chunked_backward(emitters[1], region, shared, lse, (chunks, recompute))
    except Exception:
        for emit in reversed(emitters):  # the graph as it came: nothing reads the nodes made so far
            for node in reversed(emit.made):
                graph.erase_node(node)
        raise
    weight_grad = _replace_exits(graph, region, grads, region.backward.scale if form_of(region) == FORWARD else None)
    if weight_grad is not None:
        _into_embedding_gradient(graph, weight_grad, fake_mode)
    region.loss.replace_all_uses_with(loss)
    # the old region, read by nothing now, and what only it read: dead code elimination as prepare_joint_graph does
    # it (random ops kept, so the step draws the same random numbers)
    plan_clean_up(graph, cse=False).apply()


def form_of(region: LossRegion) -> str:
    """FORWARD where the logits exist only inside the region; BACKWARD where they are returned (or a gradient from
    outside is added to theirs): docs/DESIGN.md §14."""
    return BACKWARD if region.logits_returned or region.backward.tangent is not None else FORWARD


def _first_exit(graph: fx.Graph, region: LossRegion) -> fx.Node:
    """The backward's first exit in graph order (after the loss's incoming gradient and any tangent added, which
    the exits read): where the chunked backward is written; the output where there is none."""
    bw = region.backward
    exits = {n for n in (bw.grad_hidden, bw.grad_weight, bw.grad_bias) if n is not None}
    return next((n for n in graph.nodes if n in exits), graph.output_node())


def _denominator(emit: _Emitter, region: LossRegion, valid: fx.Node) -> fx.Node | None:
    """The mean's divisor, the tokens not ignored (nll_loss's ``total_weight``); None for a sum."""
    if region.reduction == "sum":
        return None
    return emit("sum", valid, dtype=region.compute_dtype)


def _bounds(total: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` slices of ``range(total)`` (the last one shorter where they do not divide it)."""
    size = -(-total // chunks)
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def _classes(emit: _Emitter, region: LossRegion, start: int = 0, stop: int | None = None) -> fx.Node:
    """``[[start, ..., stop - 1]]`` (by default every class): the one-hot's columns."""
    device = region.hidden.meta["val"].device
    dtype = region.target.meta["val"].dtype
    size = (region.vocab if stop is None else stop) - start
    classes = emit("iota", size, start=start, step=1, dtype=dtype, device=device, requires_grad=False)
    return emit("view", classes, [1, size])


def _chunked_forward(emit: _Emitter, region: LossRegion, chunks: int):
    """(the loss, {gradient name: its value in forward}), the chunks one after another in graph order."""
    dtype = region.compute_dtype
    valid = emit("ne", region.target, region.ignore_index)
    denominator = _denominator(emit, region, valid)
    head = emit("permute", region.weight, [1, 0])  # [vocab, hidden]
    classes = _classes(emit, region)
    total, hidden_grads, weight_grad, bias_grad = None, [], None, None
    for start, stop in _bounds(region.tokens, chunks):
        after = None if weight_grad is None else (hidden_grads[-1], weight_grad)
        part = _chunk(emit, region, (head, classes, valid, denominator), start, stop, after)
        total = part["loss"] if total is None else emit("add", total, part["loss"])
        hidden_grads.append(part["hidden"])
        weight_grad = _accumulate(emit, weight_grad, part["weight"], dtype)
        if region.bias is not None:
            bias_grad = _accumulate(emit, bias_grad, part["bias"], dtype)
    return _mean(emit, region, total, denominator), _gathered(emit, region, hidden_grads, weight_grad, bias_grad)


def _mean(emit: _Emitter, region: LossRegion, total: fx.Node, denominator: fx.Node | None) -> fx.Node:
    """The loss from the chunks' sum, in the compute dtype."""
    loss = total if denominator is None else emit("div", total, denominator)
    return loss if loss.meta["val"].dtype == region.compute_dtype else emit("to", loss, region.compute_dtype)


def _gathered(emit: _Emitter, region: LossRegion, hidden_grads, weight_grad, bias_grad) -> dict:
    """{gradient name: value}: the chunks' hidden-state gradients joined, the weight's and bias's sums narrowed to
    the projection's dtype."""
    projected = region.projection.meta["val"].dtype
    weight_grad, bias_grad = (_narrowed(emit, g, projected) for g in (weight_grad, bias_grad))
    return {"hidden": emit("cat", hidden_grads), "weight": weight_grad, "bias": bias_grad}


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
    integer product (``(x == x) * 0``, exact whatever ``x`` holds, NaN included) turned into ``value``'s dtype, read
    from one element of each (a corner, or a 0-dim value itself)."""
    zero = None
    for node in previous:
        corner = node
        for dim in range(node.meta["val"].dim()):
            corner = emit("slice", corner, dim, 0, 1)
        term = emit("mul", emit("to", emit("eq", corner, corner), torch.int32), 0)
        zero = term if zero is None else emit("add", zero, term)
    return emit("add", value, emit("to", zero, value.meta["val"].dtype))


def _targets(emit: _Emitter, region: LossRegion, valid: fx.Node, start: int, stop: int):
    """(the chunk's targets as a column, 0 where ignored; its weights as a column of the compute dtype, 0 where
    ignored, 1 elsewhere)."""
    valid = emit("slice", valid, 0, start, stop)
    target = emit("unsqueeze", emit("mul", emit("slice", region.target, 0, start, stop), valid), 1)
    return target, emit("unsqueeze", emit("to", valid, region.compute_dtype), 1)


def _upcast(emit: _Emitter, region: LossRegion, logits: fx.Node) -> fx.Node:
    """``logits`` in the compute dtype (the traced graph's cast between the head and the log-softmax)."""
    return logits if logits.meta["val"].dtype == region.compute_dtype else emit("to", logits, region.compute_dtype)


def _chunk_loss(emit: _Emitter, logits: fx.Node, target: fx.Node, weight: fx.Node) -> tuple[fx.Node, fx.Node]:
    """(each token's log-sum-exp, the chunk's loss summed over its tokens not ignored)."""
    peak = emit("amax", logits, [1], True)
    lse = emit("add", emit("log", emit("sum_dims", emit("exp", emit("sub", logits, peak)), [1], True)), peak)
    picked = emit("gather", logits, 1, target)
    return lse, emit("sum", emit("mul", emit("sub", lse, picked), weight))


def _logits_grad(emit: _Emitter, logits, lse, classes, target, weight) -> fx.Node:
    """``d loss / d logits = (softmax - one_hot) * weight`` for one chunk."""
    softmax = emit("exp", emit("sub", logits, lse))
    one_hot = emit("eq", classes, target)
    return emit("mul", emit("where", one_hot, emit("sub", softmax, 1.0), softmax), weight)


def _head_grads(emit: _Emitter, region: LossRegion, grad: fx.Node, head: fx.Node, hidden: fx.Node) -> dict:
    """The chunk's parts of the head's gradients from its logits' gradient ``grad`` (the projection's dtype)."""
    part = {"hidden": emit("mm", grad, head), "weight": emit("mm", emit("permute", grad, [1, 0]), hidden)}
    if region.bias is not None:
        part["bias"] = emit("sum_dims", grad, [0])
    return part


def _chunk(emit: _Emitter, region: LossRegion, shared, start: int, stop: int, after) -> dict:
    """One chunk's loss (the sum over its tokens) and its gradients, the mean's division folded in; its logits
    computed ``_after`` the previous chunk's gradients (``after``, None for the first).  Written in the ops Inductor's
    decompositions leave (amax, exp, log, gather, where), so that Inductor lowers and fuses them as it would the
    traced loss."""
    head, classes, valid, denominator = shared
    hidden = emit("slice", region.hidden, 0, start, stop)
    hidden = hidden if after is None else _after(emit, hidden, after)
    target, weight = _targets(emit, region, valid, start, stop)
    if region.bias is None:
        logits = emit("mm", hidden, region.weight)
    else:
        logits = emit("addmm", region.bias, hidden, region.weight)
    projected_dtype = logits.meta["val"].dtype
    logits = _upcast(emit, region, logits)
    lse, loss = _chunk_loss(emit, logits, target, weight)
    if denominator is not None:
        weight = emit("div", weight, denominator)
    grad = _logits_grad(emit, logits, lse, classes, target, weight)
    if grad.meta["val"].dtype != projected_dtype:
        grad = emit("to", grad, projected_dtype)
    return {"loss": loss, **_head_grads(emit, region, grad, head, hidden)}


def _chunked_loss(emit: _Emitter, region: LossRegion, chunks: int):
    """BACKWARD's forward: (the loss, (valid, denominator), each token's log-sum-exp), the loss summed chunk by chunk
    over row slices of the returned logits (each chunk's upcast and softmax die inside it)."""
    valid = emit("ne", region.target, region.ignore_index)
    denominator = _denominator(emit, region, valid)
    total, lses = None, []
    for start, stop in _bounds(region.tokens, chunks):
        target, weight = _targets(emit, region, valid, start, stop)
        logits = _upcast(emit, region, emit("slice", region.projection, 0, start, stop))
        lse, loss = _chunk_loss(emit, logits, target, weight)
        total = loss if total is None else emit("add", total, loss)
        lses.append(lse)
    return _mean(emit, region, total, denominator), (valid, denominator), emit("cat", lses)


def _chunked_backward(emit: _Emitter, region: LossRegion, shared, lse: fx.Node, how: tuple[int, bool]) -> dict:
    """BACKWARD's backward, in column slices of the vocabulary: per slice, the logits' gradient from the
    returned logits and each token's log-sum-exp, times the loss's incoming gradient, plus the tangent's slice (in the
    dtype the traced graph added them in), then the slice's rows of the head weight's gradient (and bias's), joined,
    and its part of the hidden states' gradient, summed (``tokens × hidden``: no running sum of the weight's size).
    Each slice's logits are read ``_after`` the incoming gradient and the previous slice's gradients: all in backward
    (the cut never keeps a slice's full-height values from forward), one slice at a time.  ``how``: (the slices,
    whether each slice's logits are recomputed from the hidden states rather than read from the returned logits, which
    then die with forward's other outputs)."""
    bw, (valid, denominator), (chunks, recompute) = region.backward, shared, how
    head = emit("permute", region.weight, [1, 0])  # [vocab, hidden]
    scale = bw.scale if denominator is None else emit("div", bw.scale, denominator)
    target, weight = _targets(emit, region, valid, 0, region.tokens)
    weight = emit("mul", weight, scale)
    tangent = None if bw.tangent is None else emit("view", bw.tangent, [region.tokens, region.vocab])
    projected = region.projection.meta["val"].dtype
    hidden_grad, weight_grads, bias_grads = None, [], []
    for start, stop in _bounds(region.vocab, chunks):
        after = (scale,) if hidden_grad is None else (scale, hidden_grad, weight_grads[-1])
        if recompute:
            logits = _recomputed(emit, region, _after(emit, region.hidden, after), start, stop)
        else:
            logits = _after(emit, _upcast(emit, region, emit("slice", region.projection, 1, start, stop)), after)
        grad = _logits_grad(emit, logits, lse, _classes(emit, region, start, stop), target, weight)
        if tangent is not None:
            grad = _narrowed(emit, grad, bw.added.meta["val"].dtype)
            grad = emit("add", emit("slice", tangent, 1, start, stop), grad)
        grad = _narrowed(emit, grad, projected)
        part = emit("mm", grad, emit("slice", head, 0, start, stop))
        hidden_grad = _accumulate(emit, hidden_grad, part, region.compute_dtype)
        weight_grads.append(emit("mm", emit("permute", grad, [1, 0]), region.hidden))
        if region.bias is not None:
            bias_grads.append(emit("sum_dims", grad, [0]))
    bias_grad = emit("cat", bias_grads) if bias_grads else None
    return {"hidden": _narrowed(emit, hidden_grad, projected), "weight": emit("cat", weight_grads), "bias": bias_grad}


def _recomputed(emit: _Emitter, region: LossRegion, hidden: fx.Node, start: int, stop: int) -> fx.Node:
    """The logits' columns ``start:stop`` recomputed from ``hidden``, in the compute dtype."""
    weight = emit("slice", region.weight, 1, start, stop)
    if region.bias is None:
        return _upcast(emit, region, emit("mm", hidden, weight))
    bias = emit("slice", region.bias, -1, start, stop)
    return _upcast(emit, region, emit("addmm", bias, hidden, weight))


def _replace_exits(graph: fx.Graph, region: LossRegion, grads: dict, scale: fx.Node | None) -> fx.Node | None:
    """Each exit of the region's backward replaced by its gradient in ``grads``, times ``scale`` where given (the
    loss's incoming gradient, for gradients computed in forward); the weight's replacement (None without one)."""
    bw, weight = region.backward, None
    for exit_node, name in ((bw.grad_hidden, "hidden"), (bw.grad_weight, "weight"), (bw.grad_bias, "bias")):
        if exit_node is None:
            continue
        emit = _Emitter(graph, exit_node, region.hidden.meta["val"].fake_mode)
        value = grads[name]
        if name == "weight" and not bw.grad_weight_transposed:
            value = emit("permute", value, [1, 0])  # [hidden, vocab], the projection's right operand's own layout
        if scale is not None:
            value = emit("mul", value, scale)
        if tuple(value.meta["val"].shape) != tuple(exit_node.meta["val"].shape):
            value = emit("view", value, list(exit_node.meta["val"].shape))
        exit_node.replace_all_uses_with(value)
        weight = value if name == "weight" else weight
    return weight


def _into_embedding_gradient(graph: fx.Graph, weight_grad: fx.Node, fake_mode) -> None:
    """A tied head (docs/DESIGN.md §14): where its gradient is added to the embedding's, a scatter-add into zeros
    (Inductor's decomposition of ``embedding_dense_backward``), the scatter adds into the head's gradient instead, so
    that one weight-sized buffer holds both (Inductor clones the scatter's base in place where it dies)."""
    node = weight_grad
    while len(node.users) == 1 and next(iter(node.users)).target in LOGITS_PASSTHROUGH | TRANSPOSES:
        node = next(iter(node.users))
    value = node.meta["val"]
    for add in [u for u in node.users if u.target is ADD and len(u.args) == 2 and not u.kwargs]:
        scatter = add.args[1] if add.args[0] is node else add.args[0]
        op = EMBEDDING_SCATTERS.get(scatter.target) if isinstance(scatter, fx.Node) and _accumulates(scatter) else None
        zeros = scatter.args[0] if op is not None else None
        if zeros is None or len(scatter.users) != 1 or zeros.target is not FULL or zeros.args[1] != 0:
            continue
        same = scatter.meta["val"].shape == value.shape and scatter.meta["val"].dtype == value.dtype
        if same and value.is_contiguous() and add.meta["val"].dtype == value.dtype:
            emit = _Emitter(graph, add, fake_mode)
            add.replace_all_uses_with(emit(op, node, *scatter.args[1:], **scatter.kwargs))
            return


def _accumulates(scatter: fx.Node) -> bool:
    """Whether ``scatter`` adds into its base (``index_put`` only with ``accumulate=True``)."""
    if scatter.target is MASKED_PUT:
        return True
    return bool(scatter.args[3] if len(scatter.args) > 3 else scatter.kwargs.get("accumulate", False))
