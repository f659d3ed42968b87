"""The loss region's chunks for one partition (docs/DESIGN.md §14): as the user set them (``loss_chunks``), or
chosen by the simulated step peak (``passes/choice/loss_chunks.py``), each count's graph cut as any graph is.

``loss_split`` is the partition's step between ``prepare_joint_graph`` and the cut: a graph with no loss region the
rewrite can chunk goes straight to the cut, its report's ``loss_regions`` empty, at no cost; one with such a region
is cut once per count tried, each on its own copy of the prepared joint."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.choice.loss_chunks import ChunkTrial, choose_chunks
from fxremat_passes.graph.costs import alias_root, node_nbytes
from fxremat_passes.graph.loss_region import find_loss_regions, unrecognised_cross_entropies
from fxremat_passes.rewrite.describe import step_seconds
from fxremat_passes.rewrite.loss_chunks import chunk_loss_regions, report_row, why_not_chunked
from fxremat_passes.simulator.liveness import simulate_step

from .report import LossRegions

# why a chunkable region is left as traced by default (docs/DESIGN.md §14)
NOT_ASKED = "chunked under a peak_budget, or with loss_chunks=\"auto\" or an int"
# why the choice left it as traced (docs/DESIGN.md §14, passes/choice/loss_chunks.py)
NOT_CHOSEN = "chosen from the simulated step peaks of the counts tried"


def loss_split(joint: fx.GraphModule, request, options, profile, cut: Callable):
    """The split of the prepared ``joint`` (``cut(joint, loss_record)``: the partition's passes from there on, a
    ``_Split``), its loss region chunked as ``options`` say."""
    if options.loss_chunks == 0:  # the user's: left as traced
        return cut(joint, LossRegions())
    counted = isinstance(options.loss_chunks, int)  # the user's count (None and "auto": chosen)
    if counted and not options.compare_default:
        return cut(joint, chunk_as_asked(joint, request.graph_id, options.loss_chunks))
    found = find_loss_regions(joint.graph)
    floor = {"loss_peak_floor_bytes": floor_bytes(joint, request.num_fwd_outputs, found)} if found else {}
    regions = [r for r in found if why_not_chunked(r) is None]
    if not regions:  # nothing to try; the user's count says so as it does without compare_default
        record = chunk_as_asked(joint, request.graph_id, options.loss_chunks) if counted else _rows(found, None)
        return cut(joint, dataclasses.replace(record, **floor))
    if options.loss_chunks is None and options.peak_budget is None:
        # choosing costs a cut per count tried and each chunk's compile: only where a peak budget or "auto" asks
        return cut(joint, dataclasses.replace(_rows(found, NOT_ASKED), **floor))
    # under a peak budget the logits-returned form recomputes each slice's logits in backward (budgets may recompute
    # any matmul, docs/DESIGN.md §4.5 and §14); "auto" and the user's count never do
    trial = _trials(joint, request, profile, cut, recompute=options.peak_budget is not None and not counted)
    if counted:  # the user's count, and the graph as traced beside it for the report
        chosen = trial(options.loss_chunks)
        tried = (trial(None), chosen)
    else:
        chosen, tried = choose_chunks(trial, options.peak_budget, min(r.tokens for r in regions))
    split, caught = chosen.result
    for said in caught:
        warnings.warn_explicit(said.message, said.category, said.filename, said.lineno)
    tried_rows = tuple((t.chunks or 0, t.peak_bytes, t.step_seconds) for t in tried)
    split.records = [_tried(r, tried_rows, floor) if isinstance(r, LossRegions) else r for r in split.records]
    return split


def _tried(record: LossRegions, tried_rows: tuple, floor: dict) -> LossRegions:
    """``record`` of the count chosen with every count tried and the floor; a row left as traced by the choice says
    so."""
    rows = tuple((*row[:4], row[4] or (NOT_CHOSEN if not row[3] else None), *row[5:]) for row in record.loss_regions)
    return dataclasses.replace(record, loss_regions=rows, loss_chunks_tried=tried_rows, **floor)


def floor_bytes(joint: fx.GraphModule, num_fwd_outputs: int, regions) -> int:
    """The loss's floor (DESIGN §14): the gradients backward returns at once (the joint's outputs after forward's,
    each storage once), plus, for each region whose logits are returned, the logits and the zero gradient autograd
    hands backward for them (symbolic sizes at their hints).  No chunking goes below it, except where the caller drops
    the returned logits before backward."""
    grads = tp.extract_fwd_bwd_outputs(joint, num_fwd_outputs)[1]
    roots = {alias_root(n) for n in grads if isinstance(n, fx.Node)}
    logits = sum(2 * node_nbytes(r.projection) for r in regions if r.logits_returned)
    return sum(node_nbytes(root) for root in roots) + logits


def chunk_as_asked(joint: fx.GraphModule, graph_id: str, chunks: int) -> LossRegions:
    """``loss_chunks`` is the user's setting: where it chunks nothing in a graph, one warning says so and why (a
    cross-entropy in a form the loss region does not know is named as such, never passed over in silence)."""
    unknown = unrecognised_cross_entropies(joint.graph)
    done = chunk_loss_regions(joint, chunks)
    if not any(d.rewritten for d in done):
        why = "; ".join(sorted({d.why_not for d in done if d.why_not}))
        if unknown:
            why = (why + "; " if why else "") + (
                f"{unknown} cross-entropy(ies) in a form the loss region does not know (label_smoothing, class "
                "weights, reduction='none', logits sliced or not from a matmul; docs/DESIGN.md §14)"
            )
        why = why or "no LM head and cross-entropy in it (is the loss computed outside the compiled function?)"
        if not done and _inductor_chunks():  # Inductor's joint-graph passes ran before the partitioner saw the graph
            why += "; Inductor's auto_chunker is on and may have chunked the loss itself (torch._inductor.config"
            why += ".auto_chunker.enable): turn it off for loss_chunks to chunk it"
        warnings.warn(
            f"fxremat: loss_chunks={chunks} left {graph_id}'s loss as traced: {why}", UserWarning, stacklevel=6
        )
    return LossRegions(loss_regions=tuple(d.row for d in done))


def _inductor_chunks() -> bool:
    """Whether Inductor's opt-in auto-chunker (torch 2.11+) is on: its joint-graph pass runs a loss in chunks of its
    own (``invoke_subgraph``) before fxremat's partition sees the graph, leaving no loss region to find."""
    try:
        return bool(getattr(tp.inductor_config_value("auto_chunker"), "enable", False))
    except AttributeError:  # a torch without it
        return False


def _rows(regions, why: str | None) -> LossRegions:
    """The record of a graph whose loss regions are left as traced: each with why it cannot be chunked, else
    ``why``."""
    return LossRegions(loss_regions=tuple(report_row(r, why_not_chunked(r) or why) for r in regions))


def _trials(joint: fx.GraphModule, request, profile, cut: Callable, recompute: bool) -> Callable:
    """``trial(chunks)``: a copy of ``joint`` in ``chunks`` chunks (None: as traced), cut and simulated, a
    ``ChunkTrial`` (``recompute``: ``chunk_loss_regions``')."""

    # the backward simulated in its own order: the reordering for fewer C++ units (``_fewer_cpp_units``) simulates
    # many orders, and moves the backward, not the loss region's forward
    inputs = request.simulator.with_changes(joins_kernel_runs=False) if request.simulator is not None else None

    def trial(chunks: int | None) -> ChunkTrial:
        graph = tp.copy_graph_module(joint)  # the passes after this one mark and rewrite the copy alone
        done = chunk_loss_regions(graph, chunks, recompute) if chunks else []
        rows = tuple(d.row for d in done)
        record = LossRegions(loss_regions=rows) if done else _rows(find_loss_regions(graph.graph), None)
        with warnings.catch_warnings(record=True) as caught:  # said once, for the count chosen (``loss_split``)
            warnings.simplefilter("always")
            split = cut(graph, record)
        peak = split.peak or simulate_step(split.fw, split.bw, request.num_fwd_outputs, inputs=inputs)
        seconds = step_seconds([*split.fw.graph.nodes, *split.bw.graph.nodes], profile)
        target = next((r.peak_budget_bytes for r in split.records if hasattr(r, "peak_budget_bytes")), None)
        return ChunkTrial(chunks, peak.peak_bytes, seconds, target, result=(split, caught))

    return trial
