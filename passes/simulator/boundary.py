"""What the step holds outside the compiled graphs, between the forward's end and the backward's start.

Where the compiled module returns its loss (a scalar that receives a gradient), nothing of the step runs outside
it.  Where it returns outputs that receive a gradient and no scalar does, the caller computes the loss from them in
eager (``loss = F.cross_entropy(model(x).logits ..., y)``), and that loss's own buffers live on top of everything the
forward left alive: the saved values and the outputs.  Cross-entropy holds its log-softmax (the output's size, in
fp32 once upcast) while the output lives, then, in its backward, the log-softmax, the gradient of it and the
gradient of the output, after the output is dropped: two fp32 copies of each output beyond what the forward's end
holds.  That is the estimate (``estimated_caller_bytes``); a loss that holds less (a plain ``.sum()`` holds
nothing) or more is given exactly by ``SimulatorInputs.caller_bytes`` (``Options(caller_bytes=...)``).  The
gradients that arrive for the outputs are the backward's tangents, counted when the backward starts.
docs/DESIGN.md §6.1.
"""

from __future__ import annotations

import torch

from ..graph.costs import value_nbytes

# The caller's loss holds this many copies of each output, at fp32 or the output's own precision if wider.
LOSS_COPIES = 2
LOSS_MIN_ITEMSIZE = 4


def estimated_caller_bytes(tangents: list[torch.Tensor]) -> int:
    """The caller's loss's bytes at the boundary: 0 where a scalar output receives a gradient (the loss is
    inside), else ``LOSS_COPIES`` fp32 copies of each floating output that receives one."""
    floating = [t for t in tangents if t.is_floating_point()]
    counts = [value_nbytes(t) // t.element_size() for t in floating]  # a symbolic size at its hint
    if not floating or 1 in counts:
        return 0
    return sum(LOSS_COPIES * n * max(t.element_size(), LOSS_MIN_ITEMSIZE) for n, t in zip(counts, floating))


def caller_bytes(given: int | None, tangents: list[torch.Tensor]) -> int:
    """``given`` (the user's figure) where there is one, else the estimate."""
    return estimated_caller_bytes(tangents) if given is None else given
