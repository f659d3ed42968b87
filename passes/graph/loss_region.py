"""The loss region of a joint graph (docs/DESIGN.md §14): the LM head's projection, whose output (the logits,
``tokens × vocabulary``) reaches a cross-entropy only through views and dtype casts, the cross-entropy reduced to one
scalar (mean or sum), and the backward nodes from the cross-entropy's gradient to the projection's gradients.

The forms found are the ones users write: ``F.cross_entropy(logits.view(-1, V), labels.view(-1))`` with reduction
mean or sum and any ``ignore_index``, and transformers' ``ForCausalLMLoss`` (labels shifted by padding, so the logits
are not sliced; the fp32 upcast a cast in the chain).  A per-class weight, ``label_smoothing`` or ``reduction="none"``
is not a loss region here.  The record is plain data: what a rewrite needs, and whether the logits are read outside
the region (then they must exist whole)."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from .ops import (
    DTYPE_CASTS,
    LOG_SOFTMAX,
    LOG_SOFTMAX_BACKWARD,
    LOGITS_PASSTHROUGH,
    MM,
    NLL_BACKWARD,
    NLL_FORWARD,
    PROJECTIONS,
    SUM_DIMS,
    TRANSPOSES,
)

REDUCTIONS = {1: "mean", 2: "sum"}  # ATen's reduction enum, as nll_loss_forward takes it
_CHAIN = LOGITS_PASSTHROUGH | DTYPE_CASTS


@dataclass(frozen=True)
class LossBackward:
    """Where the cross-entropy's gradient leaves the region: the nodes whose uses a rewrite replaces."""

    scale: fx.Node  # the loss's incoming gradient (nll_loss_backward's grad_output): the backward is linear in it
    grad_hidden: fx.Node | None  # [tokens, hidden]
    grad_weight: fx.Node | None  # the gradient of the projection's right operand, [hidden, vocab] ...
    grad_weight_transposed: bool  # ... or, where True, its transpose [vocab, hidden] (the head's weight's layout)
    grad_bias: fx.Node | None  # a sum over the tokens, [vocab] or [1, vocab]
    nodes: tuple[fx.Node, ...]  # the region's backward nodes, the exits above excluded


@dataclass(frozen=True)
class LossRegion:
    projection: fx.Node  # mm(hidden, weight) or addmm(bias, hidden, weight): the logits
    hidden: fx.Node  # [tokens, hidden]
    weight: fx.Node  # [hidden, vocab]: the projection's right operand (a transpose of the head's weight)
    bias: fx.Node | None
    log_softmax: fx.Node
    nll_forward: fx.Node
    loss: fx.Node  # the scalar loss
    target: fx.Node  # [tokens] class indices
    reduction: str  # "mean" or "sum"
    ignore_index: int
    tokens: int
    vocab: int
    logits_returned: bool  # a value of the logits' chain is read outside the region (a graph output, or another op)
    forward_nodes: tuple[fx.Node, ...]
    backward: LossBackward | None  # None where the backward is not the plain one this module knows

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
    """Every loss region of ``graph``, in graph order (none in a graph without a cross-entropy)."""
    found = []
    for nll in graph.find_nodes(op="call_function", target=NLL_FORWARD):
        region = _region_of(nll)
        if region is not None:
            found.append(region)
    return found


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
    chain, node = [], log_softmax.args[0]
    while isinstance(node, fx.Node) and node.target in _CHAIN:
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.target not in PROJECTIONS:
        return None
    projection = node
    if projection.kwargs:  # addmm's beta or alpha
        return None
    bias, hidden, weight_operand = projection.args if projection.target is not MM else (None, *projection.args)
    tokens, vocab = _shape(projection) or (0, 0)
    if _shape(log_softmax) != (tokens, vocab) or _shape(target) != (tokens,):
        return None
    forward = [projection, *reversed(chain), log_softmax, nll, *(u for u in nll.users)]
    forward += [u for u in log_softmax.users if u.target in LOGITS_PASSTHROUGH]  # detached copies for its backward
    backward = _backward_of(log_softmax, nll, hidden, (tokens, vocab))
    inside = set(forward) | set(backward.nodes if backward else ())
    logits_returned = any(u not in inside for n in (projection, *chain) for u in n.users)
    return LossRegion(
        projection=projection,
        hidden=hidden,
        weight=weight_operand,
        bias=bias,
        log_softmax=log_softmax,
        nll_forward=nll,
        loss=loss,
        target=target,
        reduction=REDUCTIONS[reduction],
        ignore_index=int(ignore_index),
        tokens=tokens,
        vocab=vocab,
        logits_returned=logits_returned,
        forward_nodes=tuple(forward),
        backward=backward,
    )


def _backward_of(log_softmax: fx.Node, nll: fx.Node, hidden: fx.Node, logits_shape) -> LossBackward | None:
    """The cross-entropy's backward, from ``nll_loss_backward`` through the log-softmax's backward, views, casts
    and transposes to the projection's gradients (two matmuls and, with a bias, a sum over the tokens).  Any other
    reader of a value inside makes it None: only these exits can be replaced."""
    nll_backward = next((u for u in log_softmax.users if u.target is NLL_BACKWARD and u.args[2] is nll.args[1]), None)
    if nll_backward is None:
        return None
    inside, exits, todo = [nll_backward], [], [nll_backward]
    while todo:
        for user in todo.pop().users:
            if user in inside or user in exits:
                continue
            if user.target in _CHAIN or user.target in TRANSPOSES or user.target is LOG_SOFTMAX_BACKWARD:
                inside.append(user)
                todo.append(user)
            elif user.target is MM or user.target is SUM_DIMS:
                exits.append(user)
            else:
                return None
    return _classify_exits(nll_backward, inside, exits, hidden, logits_shape)


def _classify_exits(nll_backward, inside, exits, hidden: fx.Node, logits_shape) -> LossBackward | None:
    tokens, vocab = logits_shape
    width = (_shape(hidden) or (0, 0))[1]
    hidden_t = {hidden, *(u for u in hidden.users if u.target in TRANSPOSES)}
    found: dict[str, fx.Node] = {}
    transposed = False
    for exit_node in exits:
        shape, operands = _shape(exit_node), exit_node.args[:2]
        outside = [a for a in operands if a not in inside] if exit_node.target is MM else []
        if exit_node.target is SUM_DIMS and list(exit_node.args[1]) == [0] and shape in ((vocab,), (1, vocab)):
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
        scale=nll_backward.args[0],
        grad_hidden=found.get("hidden"),
        grad_weight=found.get("weight"),
        grad_weight_transposed=transposed,
        grad_bias=found.get("bias"),
        nodes=tuple(inside),
    )
