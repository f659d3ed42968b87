"""The loss region of a joint graph (docs/DESIGN.md §14): the LM head's projection, whose output (the logits,
``tokens × vocabulary``) reaches a cross-entropy only through views and dtype casts, the cross-entropy reduced to one
scalar (mean or sum), and the backward nodes from the cross-entropy's gradient to the projection's gradients.

The forms found are the ones users write: ``F.cross_entropy(logits.view(-1, V), labels.view(-1))`` with reduction
mean or sum and any ``ignore_index``, and transformers' ``ForCausalLMLoss`` (labels shifted by padding, so the logits
are not sliced; the fp32 upcast a cast in the chain).  A per-class weight, ``label_smoothing`` or ``reduction="none"``
is not a loss region here.  Each is found as ATen ops (``aot_function``'s joint) and as Inductor's decompositions
leave it (``torch.compile``'s joint).  The record is plain data: what a rewrite needs, and whether the logits are
read outside the region (then they must exist whole)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

from .ops import (
    ADD,
    AMAX,
    DECOMPOSED_LOSS_BACKWARD,
    DIV,
    DTYPE_CASTS,
    EQ,
    EXP,
    EXPAND,
    FULL,
    GATHER,
    IOTA,
    LOG,
    LOG_SOFTMAX,
    LOG_SOFTMAX_BACKWARD,
    LOGITS_PASSTHROUGH,
    MM,
    MUL,
    NE_SCALAR,
    NEG,
    NLL_BACKWARD,
    NLL_FORWARD,
    PROJECTIONS,
    SCALAR_TENSOR,
    SCATTER_VALUE,
    SQUEEZE_DIM,
    SUB,
    SUM,
    SUM_DIMS,
    TRANSPOSES,
    UNSQUEEZE,
    VIEW,
    WHERE,
)

REDUCTIONS = {1: "mean", 2: "sum"}  # ATen's reduction enum, as nll_loss_forward takes it
_CHAIN = LOGITS_PASSTHROUGH | DTYPE_CASTS
# a forward value of the region is read in backward by these only (the log-softmax's backward reads its output, or
# its exp in the decomposed form); past them, the backward's own ops
_ENTRIES = _CHAIN | TRANSPOSES | {LOG_SOFTMAX_BACKWARD, NLL_BACKWARD, EXP}
_BACKWARD_OPS = _CHAIN | TRANSPOSES | {LOG_SOFTMAX_BACKWARD} | DECOMPOSED_LOSS_BACKWARD


@dataclass(frozen=True)
class LossBackward:
    """Where the cross-entropy's gradient leaves the region: the nodes whose uses a rewrite replaces."""

    scale: fx.Node  # the loss's incoming gradient (nll_loss_backward's grad_output): the backward is linear in it
    grad_hidden: fx.Node | None  # [tokens, hidden]
    grad_weight: fx.Node | None  # the gradient of the projection's right operand, [hidden, vocab] ...
    grad_weight_transposed: bool  # ... or, where True, its transpose [vocab, hidden] (the head's weight's layout)
    grad_bias: fx.Node | None  # a sum over the tokens, [vocab] or [1, vocab]
    nodes: tuple[fx.Node, ...]  # the region's backward nodes, the exits above excluded
    # where the logits are returned: ``add(tangent, the loss's gradient of the logits)``, the gradient the caller's
    # use of the returned logits sends back (autograd's zero tensor where it makes none), added in ``added``'s dtype
    added: fx.Node | None = None
    tangent: fx.Node | None = None


@dataclass(frozen=True)
class LossRegion:
    """The region's nodes; its projection's operands and shape are read from the projection (``hidden``,
    ``weight``, ``bias``, ``tokens``, ``vocab``)."""

    projection: fx.Node  # mm(hidden, weight) or addmm(bias, hidden, weight): the logits, [tokens, vocab]
    log_softmax: fx.Node  # its output (``_log_softmax``, or the last ``sub`` of its decomposition)
    loss: fx.Node  # the scalar loss
    target: fx.Node  # [tokens] class indices
    reduction: str  # "mean" or "sum"
    ignore_index: int
    logits_returned: bool  # a value of the logits' chain is read outside the region (a graph output, or another op)
    forward_nodes: tuple[fx.Node, ...]
    backward: LossBackward | None  # None where the backward is not the plain one this module knows

    @property
    def hidden(self) -> fx.Node:
        """[tokens, hidden]: the projection's left operand."""
        return _operands(self.projection)[1]

    @property
    def weight(self) -> fx.Node:
        """[hidden, vocab]: the projection's right operand (a transpose of the head's weight)."""
        return _operands(self.projection)[2]

    @property
    def bias(self) -> fx.Node | None:
        return _operands(self.projection)[0]

    @property
    def tokens(self) -> int:
        return _shape(self.projection)[0]

    @property
    def vocab(self) -> int:
        return _shape(self.projection)[1]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the log-softmax runs in (fp32 after transformers' upcast)."""
        return self.log_softmax.meta["val"].dtype


def _shape(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _getitem(node: fx.Node, index: int) -> fx.Node | None:
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == index), None)


def find_loss_regions(graph: fx.Graph) -> list[LossRegion]:
    """Every loss region of ``graph``, in graph order (none in a graph without a cross-entropy): as ATen ops
    (``aot_function``'s joint) or as Inductor's decompositions left them (``torch.compile``'s joint)."""
    found = []
    for nll in graph.find_nodes(op="call_function", target=NLL_FORWARD):
        region = _region_of(nll)
        if region is not None:
            found.append(region)
    for gather in graph.find_nodes(op="call_function", target=GATHER):
        region = _decomposed_region_of(gather)
        if region is not None:
            found.append(region)
    return found


def unrecognised_cross_entropies(graph: fx.Graph) -> int:
    """How many cross-entropy cores (a log-softmax, as ATen op or decomposed, read by a gather or an NLL) the graph
    holds that ``find_loss_regions`` did not take: what ``loss_chunks``' warning names."""
    found = {r.log_softmax for r in find_loss_regions(graph)}
    cores = [n for n in graph.find_nodes(op="call_function", target=LOG_SOFTMAX)]
    cores += [n for n in graph.find_nodes(op="call_function", target=SUB) if _decomposed_log_softmax(n) is not None]
    return sum(1 for n in cores if n not in found and any(u.target in (NLL_FORWARD, GATHER) for u in n.users))


def _projection_of(node) -> tuple[fx.Node, list[fx.Node]] | None:
    """(the projection, the views and casts between it and ``node``, in graph order), or None."""
    chain = []
    while isinstance(node, fx.Node) and node.target in _CHAIN:
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.target not in PROJECTIONS or node.kwargs:  # addmm's beta or alpha
        return None
    return node, chain[::-1]


def _operands(projection: fx.Node):
    """(bias or None, hidden, weight) of ``mm`` or ``addmm``."""
    return projection.args if projection.target is not MM else (None, *projection.args)


def _region_of(nll: fx.Node) -> LossRegion | None:
    if len(nll.args) < 5:
        return None
    log_softmax, target, weight, reduction, ignore_index = nll.args[:5]
    loss = _getitem(nll, 0)
    if weight is not None or reduction not in REDUCTIONS or loss is None or not isinstance(log_softmax, fx.Node):
        return None
    if (
        log_softmax.target is not LOG_SOFTMAX
        or len(_shape(log_softmax) or ()) != 2
        or log_softmax.args[1] not in (1, -1)
    ):
        return None
    found = _projection_of(log_softmax.args[0])
    if found is None:
        return None
    projection, chain = found
    forward = [projection, *chain, log_softmax, nll, *(u for u in nll.users)]
    forward += [u for u in log_softmax.users if u.target in LOGITS_PASSTHROUGH]  # detached copies for its backward
    nll_backward = next((u for u in log_softmax.users if u.target is NLL_BACKWARD and u.args[2] is target), None)
    starts = [nll_backward] if nll_backward is not None else []
    scale = nll_backward.args[0] if nll_backward is not None else None
    return _region(
        projection, chain, log_softmax, loss, target, REDUCTIONS[reduction], int(ignore_index), forward, starts, scale
    )


def _region(projection, chain, log_softmax, loss, target, reduction, ignore_index, forward, starts, scale):
    """The record, once a form's matcher has found its parts (``starts``: the backward's first nodes, beside the
    forward's readers; ``scale``: the loss's incoming gradient, None where not found)."""
    logits = _shape(projection)
    if logits is None or _shape(log_softmax) != logits or _shape(target) != logits[:1]:
        return None
    backward = _backward_of(forward, starts, scale, _operands(projection)[1], logits)
    inside = set(forward) | set(backward.nodes if backward else ())
    logits_returned = any(u not in inside for n in (projection, *chain) for u in n.users)
    return LossRegion(
        projection=projection,
        log_softmax=log_softmax,
        loss=loss,
        target=target,
        reduction=reduction,
        ignore_index=ignore_index,
        logits_returned=logits_returned,
        forward_nodes=tuple(forward),
        backward=backward,
    )


def _is(node, target, *args) -> bool:
    """``node`` calls ``target`` with ``args`` first (each an exact value, or ANY)."""
    return (
        isinstance(node, fx.Node)
        and node.target is target
        and len(node.args) >= len(args)
        and all(a is ANY or node.args[i] == a for i, a in enumerate(args))
    )


ANY = object()


def _decomposed_log_softmax(logp: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """``sub(shifted, log(sum(exp(shifted), [1], True)))`` with ``shifted = sub(x, amax(x, [1], True))``:
    (x, the log-softmax's nodes), or None."""
    if not _is(logp, SUB) or not _is(logp.args[1], LOG):
        return None
    shifted, log = logp.args[:2]
    total = log.args[0]
    if not _is(total, SUM_DIMS, ANY, [1], True) and not _is(total, SUM_DIMS, ANY, [-1], True):
        return None
    exp = total.args[0]
    if not _is(exp, EXP, shifted) or not _is(shifted, SUB) or not isinstance(shifted.args[1], fx.Node):
        return None
    x, amax = shifted.args[:2]
    if not (_is(amax, AMAX, x, [1], True) or _is(amax, AMAX, x, [-1], True)):
        return None
    return x, [amax, shifted, exp, total, log, logp]


def _decomposed_nll(gather: fx.Node):
    """``torch._decomp``'s ``nll_loss_forward`` from its gather: (target, ignore_index, reduction, loss, the count of
    tokens not ignored or None, its nodes), or None."""
    index = gather.args[2]
    if not _is(gather, GATHER, ANY, 1) or not _is(index, UNSQUEEZE, ANY, 1) or not _is(index.args[0], WHERE):
        return None
    valid, target, _ = index.args[0].args
    if not _is(valid, NE_SCALAR, target):
        return None
    (squeeze,) = gather.users if len(gather.users) == 1 else (None,)
    (neg,) = squeeze.users if _is(squeeze, SQUEEZE_DIM, gather, 1) and len(squeeze.users) == 1 else (None,)
    (masked,) = neg.users if _is(neg, NEG) and len(neg.users) == 1 else (None,)
    (total,) = masked.users if _is(masked, WHERE, valid, neg) and len(masked.users) == 1 else (None,)
    if not _is(total, SUM):
        return None
    nodes = [index.args[0], index, gather, squeeze, neg, masked, total]
    count = next((c for c in valid.users if _is(c, SUM, valid)), None)
    count = next((c for c in count.users if c.target in DTYPE_CASTS), None) if count is not None else None
    mean = next((d for d in total.users if _is(d, DIV, total, count)), None) if count is not None else None
    if mean is None:
        return target, valid.args[1], "sum", total, None, [valid, *nodes]
    return target, valid.args[1], "mean", mean, count, [valid, *nodes, mean]


def _decomposed_region_of(gather: fx.Node) -> LossRegion | None:
    found = _decomposed_log_softmax(gather.args[0]) if isinstance(gather.args[0], fx.Node) else None
    nll = _decomposed_nll(gather) if found is not None else None
    if nll is None:
        return None
    x, softmax_nodes = found
    target, ignore_index, reduction, loss, count, nll_nodes = nll
    projected = _projection_of(x)
    if projected is None or not isinstance(ignore_index, int):
        return None
    projection, chain = projected
    logp = softmax_nodes[-1]
    forward = [projection, *chain, *softmax_nodes, *nll_nodes]
    grad = _decomposed_nll_backward(logp, target, ignore_index)
    if grad is None:
        return _region(projection, chain, logp, loss, target, reduction, ignore_index, forward, [], None)
    product, scaled = grad
    scale = scaled.args[0] if count is not None and _is(scaled, DIV, ANY, count) else scaled
    if reduction == "mean" and scale is scaled or _shape(scale) != ():
        scale = None
    return _region(projection, chain, logp, loss, target, reduction, ignore_index, forward, [product], scale)


def _decomposed_nll_backward(logp: fx.Node, target: fx.Node, ignore_index: int):
    """``torch._decomp``'s ``nll_loss_backward`` as the log-softmax's backward reads it: ``sub(G, mul(exp(logp),
    sum(G, [1], True)))`` with ``G = mul(one_hot, where(ne(target[:, None], ignore_index), g, 0))``: (G, g), where
    ``g`` is the loss's incoming gradient, divided by the count for a mean."""
    for exp in (u for a in _aliases(logp) for u in a.users if _is(u, EXP, a)):
        for product in (u for u in exp.users if _is(u, MUL)):
            total = product.args[1] if product.args[0] is exp else product.args[0]
            if not _is(total, SUM_DIMS) or not isinstance(total.args[0], fx.Node):
                continue
            grad = total.args[0]
            if not _is(grad, MUL) or not any(_is(u, SUB, grad, product) for u in product.users):
                continue
            mask = next((a for a in grad.args if _shape(a) == (_shape(grad)[0], 1)), None)
            if not any(_is_one_hot(a, target) for a in grad.args):
                continue
            if _is(mask, WHERE) and _is(mask.args[0], NE_SCALAR, ANY, ignore_index):
                cond = mask.args[0].args[0]
                if _is(cond, UNSQUEEZE, target, 1) and isinstance(mask.args[1], fx.Node):
                    return grad, mask.args[1]
    return None


def _is_one_hot(node, target: fx.Node) -> bool:
    """The one-hot the NLL's backward puts its -1 into, at the target as a column (``where``-masked where ignored):
    ``scatter(zeros, 1, index, -1.0)`` as decomposed, or ``where(eq(index, iota(vocab)[None]), -1.0, 0)`` as
    Inductor's joint-graph passes rewrite a scatter into a constant."""
    if _is(node, SCATTER_VALUE, ANY, 1, ANY, -1.0) and _is(node.args[0], FULL, ANY, 0):
        return _is_target_column(node.args[2], target)
    if not _is(node, WHERE) or not (_constant(node.args[1], -1.0) and _constant(node.args[2], 0)):
        return False
    eq = node.args[0]
    if not _is(eq, EQ) or not isinstance(eq.args[1], fx.Node):
        return False
    index, classes = eq.args[:2]
    index = index.args[0] if _is(index, EXPAND) else index
    classes = classes.args[0] if _is(classes, VIEW, ANY, [1, _shape(node)[1]]) else None
    iota = _is(classes, IOTA, _shape(node)[1]) and classes.kwargs.get("start") == 0 and classes.kwargs.get("step") == 1
    return iota and _is_target_column(index, target)


def _constant(node, value) -> bool:
    """``node`` is a 0-dim constant equal to ``value`` (``scalar_tensor`` or ``full([], value)``)."""
    return _is(node, SCALAR_TENSOR, value) or _is(node, FULL, [], value)


def _is_target_column(index, target: fx.Node) -> bool:
    """``target[:, None]``, or ``where(ne(target[:, None], ...), target[:, None], ...)``."""
    index = index.args[1] if _is(index, WHERE) and _is(index.args[0], NE_SCALAR, index.args[1]) else index
    return _is(index, UNSQUEEZE, target, 1)


def _aliases(node: fx.Node) -> list[fx.Node]:
    """``node`` and the views of it (``alias``, ``detach``: what functionalization leaves between the log-softmax and
    its backward's ``exp``), whatever their depth."""
    found, todo = [], [node]
    while todo:
        found.append(todo.pop())
        todo += [u for u in found[-1].users if u.target in LOGITS_PASSTHROUGH and u.args[0] is found[-1]]
    return found


def _backward_of(forward, starts, scale, hidden: fx.Node, logits_shape) -> LossBackward | None:
    """The cross-entropy's backward, from the readers of the forward's values (and ``starts``) through views, casts,
    transposes and the log-softmax's backward to the projection's gradients (two matmuls and, with a bias, a sum over
    the tokens), through one ``add`` of a gradient from outside where the logits are returned.  Any other reader of a
    value inside makes it None: only these exits can be replaced."""
    if scale is None or not starts:
        return None
    known = set(forward)
    inside, exits, todo, added = list(starts), [], list(starts), []
    todo += [n for n in forward if _shape(n) == logits_shape]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user in inside or user in exits or user in known or user.op == "output":  # returned: logits_returned
                continue
            if node in known and user.target not in _ENTRIES:
                return None  # a forward value read by something else: another loss term (label smoothing, ...)
            tangent = None if added else _tangent_added(user, node, known, inside)
            if tangent is not None:
                added += [user, tangent]
                inside.append(user)
                todo.append(user)
            elif _is(user, SUM_DIMS) and list(user.args[1]) == [0]:
                exits.append(user)
            elif user.target in _BACKWARD_OPS:
                inside.append(user)
                todo.append(user)
            elif user.target is MM:
                exits.append(user)
            else:
                return None
    found = _classify_exits(scale, inside, exits, hidden, logits_shape)
    if found is None or not added:
        return found
    if added[1] in inside:  # both addends the region's own
        return None
    return replace(found, added=added[0], tangent=added[1])


def _tangent_added(add, node, known, inside) -> fx.Node | None:
    """Where ``add`` (a reader of ``node``, a value of the backward) is ``add(tangent, node)`` or ``add(node,
    tangent)`` with ``tangent`` from outside the region and of the sum's shape: that tangent, else None."""
    if not _is(add, ADD) or len(add.args) != 2 or add.kwargs:
        return None
    ours = [a for a in add.args if a is node or a in inside]
    others = [a for a in add.args if isinstance(a, fx.Node) and a not in ours and a not in known]
    if len(ours) != 1 or len(others) != 1 or _shape(others[0]) != _shape(add):
        return None
    return others[0]


def _classify_exits(scale, inside, exits, hidden: fx.Node, logits_shape) -> LossBackward | None:
    tokens, vocab = logits_shape
    width = (_shape(hidden) or (0, 0))[1]
    hidden_t = {hidden, *(u for u in hidden.users if u.target in TRANSPOSES)}
    found: dict[str, fx.Node] = {}
    transposed = False
    for exit_node in exits:
        shape, operands = _shape(exit_node), exit_node.args[:2]
        outside = [a for a in operands if a not in inside] if exit_node.target is MM else []
        if exit_node.target is SUM_DIMS and shape in ((vocab,), (1, vocab)):
            kind = "bias"
        elif len(outside) == 1 and shape == (tokens, width) and outside[0] not in hidden_t:
            kind = "hidden"
        elif len(outside) == 1 and shape in ((vocab, width), (width, vocab)) and outside[0] in hidden_t:
            kind, transposed = "weight", shape == (vocab, width)
        else:
            return None
        if kind in found:
            return None
        found[kind] = exit_node
    return LossBackward(
        scale=scale,
        grad_hidden=found.get("hidden"),
        grad_weight=found.get("weight"),
        grad_weight_transposed=transposed,
        grad_bias=found.get("bias"),
        nodes=tuple(inside),
    )
