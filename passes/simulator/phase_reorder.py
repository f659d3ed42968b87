"""A simulated graph's kernels as Inductor's peak-memory reordering sees them (``peak_order.OrderProblem``), and the
order it keeps.  Read by ``phase._Phase.fusion_order``."""

from __future__ import annotations

import torch.fx as fx

from .peak_order import Buffer, OrderProblem, reordered

# A sort replaces the order Inductor was given only where it is lower by more than this, by the simulator's
# estimate of Inductor's estimate.  The given order wins a tie, and neither the simulated kernels nor their given
# order are exactly Inductor's: on the plans of ``peak_table.py``'s table Inductor kept its given order every time,
# while the simulator put a sort up to 4.7% lower (T5's default); where Inductor does reorder, the gain is larger
# than that.  The margin sits between the two: docs/DESIGN.md §6 ("Inductor reorders the kernels") and §13.
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
    return OrderProblem(preds, tuple(buffers), phase.inputs.estimate_counts_outputs)


def peak_reordered(phase, order: list[fx.Node]) -> list[fx.Node]:
    """``order`` as Inductor's scheduler leaves it: reordered for its estimated peak where its config says so."""
    if len(order) < 2 or not phase.inputs.reorders_for_peak:
        return order
    return [order[k] for k in reordered(order_problem(phase, order), REORDER_MARGIN)]
