"""A simulated graph's kernels as Inductor's peak-memory reordering sees them (``peak_order.OrderProblem``), and the
order it keeps.  Read by ``phase._Phase.fusion_order``."""

from __future__ import annotations

import torch.fx as fx

from .. import _torch_private as tp
from .peak_order import Buffer, OrderProblem, reordered

# A sort replaces the order Inductor was given only where it is lower by more than this, by the simulator's
# estimate of Inductor's estimate.  The given order wins a tie, and neither the simulated kernels nor their given
# order are exactly Inductor's: on the plans of issue #15's table Inductor kept its given order every time it was
# asked (session 32: eleven compiles of nine models, two of them of plans not shipped), while the simulator put a
# sort lower by 0.4% (a conv net's ``peak_budget=0.0``: a tie to Inductor, 139,664 B both; taken, it judged the plan
# measured at 135,640 B to peak at 168,376 and chose another, measured 172,432), 2.4% (BERT), 2.7% and 4.6%
# (Mixtral), 4.7% (T5's default: its given order simulated at 22.30 MB against Inductor's 21.78, so a sort at 21.25
# looked better; Inductor's own sort was at 22.57).  Where Inductor does reorder, the gain is larger: ViT's
# backward with its recomputation moved three stretches earlier (benchmarks/hoisted_recompute.py), lpmf 12% below
# the given order here, 9% by Inductor's estimate (8.93 MB against 9.77), and replayed within 8 bytes of the
# measured peak (benchmarks/RESULTS.md, session 32).
REORDER_MARGIN = 0.05


def order_problem(phase, order: list[fx.Node]) -> OrderProblem:
    """``phase``'s kernels (heads, in ``order``) as integers: what each allocates (every storage its units own, as
    the walk counts them, kernel-local ones included: Inductor's estimate has them too), who reads it, and the
    backward's saved tensors (the inputs Inductor may free: ``phase.estimated_inputs``) from the start."""
    place = {head: k for k, head in enumerate(order)}
    produced: dict[fx.Node, int] = {}
    for head, k in place.items():
        for u in phase.kernels[head]:
            for node in phase.owned[u]:
                produced[node] = k
    readers: dict[fx.Node, set[int]] = {}
    for head, k in place.items():
        for u in phase.kernels[head]:
            for r in phase.unit_reads[u]:
                if produced.get(r, -1) != k:
                    readers.setdefault(r, set()).add(k)
    outputs = phase.keep | {n.name for n in phase.returned}
    nbytes = phase.facts.nbytes
    buffers = [
        Buffer(nbytes(node), k, frozenset(readers.get(node, ())), node.name in outputs) for node, k in produced.items()
    ]
    for node, read in readers.items():
        if node not in produced and node.name in phase.estimated_inputs:
            buffers.append(Buffer(phase.estimated_inputs[node.name], -1, frozenset(read), node.name in outputs))
    preds = tuple(frozenset(place[p] for p in phase.kernel_pred[head]) for head in order)
    return OrderProblem(preds, tuple(buffers), tp.inductor_estimate_counts_outputs())


def peak_reordered(phase, order: list[fx.Node]) -> list[fx.Node]:
    """``order`` as Inductor's scheduler leaves it: reordered for its estimated peak where its config says so."""
    if len(order) < 2 or not tp.inductor_reorders_for_peak_memory():
        return order
    return [order[k] for k in reordered(order_problem(phase, order), REORDER_MARGIN)]
