"""The loss region's chunk count chosen from the simulated step peak (``passes/choice/loss_chunks.py``,
``fxremat/loss_choice.py``, docs/DESIGN.md §14): the rule on literal trials, then through AOTAutograd with no-op
compilers on a model whose step peaks at its loss, gradients against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import assert_grads_close, eager_grads, recording_partition_fn, run_aot

import fxremat
from fxremat.examples import example
from fxremat.options import Options
from fxremat_passes.choice.loss_chunks import (
    CANDIDATE_CHUNKS,
    DEFAULT_MOST_CHUNKS,
    NEGLIGIBLE_TIME,
    ChunkTrial,
    choose_chunks,
)
from fxremat_passes.graph.ops import LOG_SOFTMAX

# --- the rule, on literal trials ----------------------------------------------------------------------------------

# chunks -> (simulated peak, estimated seconds): the peak falls with the count, the time rises past 8
TRIALS = {None: (1000, 1.0), 2: (600, 1.0), 4: (400, 1.0), 8: (300, 1.005), 16: (295, 1.02), 32: (290, 1.5)}


def _trial(target=None):
    asked = []

    def trial(chunks):
        asked.append(chunks)
        peak, seconds = TRIALS[chunks]
        return ChunkTrial(chunks, peak, seconds, target)

    return trial, asked


@pytest.mark.parametrize(
    ("budget", "target", "chosen", "asked"),
    [
        (None, None, 8, [None, 2, 4, 8]),  # the default tries at most DEFAULT_MOST_CHUNKS
        (0.0, 1000, 32, [None, 2, 4, 8, 16, 32]),  # the lowest peak, whatever the time
        (450, None, 4, [None, 2, 4]),  # bytes: the smallest count that fits
        (1000, None, None, [None]),  # the graph as traced fits: no chunks
        (10, None, 32, [None, 2, 4, 8, 16, 32]),  # nothing fits: the lowest
        (0.5, 500, 4, [None, 2, 4]),  # a fraction: the bytes the graph as traced reads it as
    ],
)
def test_the_count_chosen(budget, target, chosen, asked):
    trial, seen = _trial(target)
    picked, tried = choose_chunks(trial, budget, tokens=1024)
    assert picked.chunks == chosen
    assert seen == asked and [t.chunks for t in tried] == asked


def test_no_count_beyond_the_tokens():
    trial, seen = _trial()
    choose_chunks(trial, 0.0, tokens=5)
    assert seen == [None, 2, 4]


def test_the_default_stops_at_its_most_chunks_where_more_would_still_lower_the_peak():
    halving = {k: (1000 // (k or 1), 1.0) for k in (None, *CANDIDATE_CHUNKS)}
    picked, tried = choose_chunks(lambda k: ChunkTrial(k, *halving[k]), None, tokens=1024)
    assert picked.chunks == DEFAULT_MOST_CHUNKS and max(t.chunks or 1 for t in tried) == DEFAULT_MOST_CHUNKS
    lowest, _ = choose_chunks(lambda k: ChunkTrial(k, *halving[k]), 0.0, tokens=1024)
    assert lowest.chunks == max(CANDIDATE_CHUNKS)


def test_time_beyond_negligible_stops_the_default():
    slow = {**TRIALS, 2: (600, 1.2)}
    picked, tried = choose_chunks(lambda k: ChunkTrial(k, *slow[k]), None, tokens=1024)
    assert picked.chunks is None and [t.chunks for t in tried] == [None, 2]



@pytest.mark.parametrize(
    ("changed", "chosen"),
    [
        ({4: (595, 1.0), 8: (590, 1.0)}, 2),  # 4 and 8 each lower the peak by under MIN_PEAK_GAIN: not taken
        ({2: (600, 1.0 + 2 * NEGLIGIBLE_TIME)}, None),  # twice the negligible time: the search ends at once
        ({8: (300, 1.0 + NEGLIGIBLE_TIME / 2)}, 8),  # half of it: taken
    ],
)
def test_the_defaults_thresholds(changed, chosen):
    trials = {**TRIALS, **changed}
    picked, _ = choose_chunks(lambda k: ChunkTrial(k, *trials[k]), None, tokens=1024)
    assert picked.chunks == chosen

def test_a_count_that_does_not_lower_the_peak_does_not_end_the_default():
    """The peak is not monotone in the count (a plan or a fusion changes at one count): 2 chunks above the graph as
    traced, 4 below it (docs/DESIGN.md §14)."""
    bumpy = {**TRIALS, 2: (1010, 1.0)}
    picked, tried = choose_chunks(lambda k: ChunkTrial(k, *bumpy[k]), None, tokens=1024)
    assert picked.chunks == 8 and [t.chunks for t in tried] == [None, 2, 4, 8]


# --- through AOTAutograd --------------------------------------------------------------------------------------------

VOCAB, TOKENS = 2048, (2, 64)  # logits 1 MiB in fp32 beside 0.4 MiB of parameters: the step peaks at the loss


def _inputs():
    torch.manual_seed(0)
    ids, labels = torch.randint(0, VOCAB, TOKENS), torch.randint(0, VOCAB, TOKENS)
    labels[0, :3] = -100
    return ids, labels


class BigVocabLM(torch.nn.Module):
    """Embedding -> a small body -> LM head -> mean cross-entropy, the loss alone returned."""

    def __init__(self, hidden=16):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.body = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh())
        self.head = torch.nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.body(self.embed(ids)))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


def _step(**settings):
    """(the report, the graphs' nodes) of one step of the big-vocabulary LM; its gradients checked against eager."""
    model, inputs = BigVocabLM(), _inputs()
    _, expected = eager_grads(model, inputs)
    partition_fn, reports, graphs = recording_partition_fn(**settings)

    _, grads, _ = run_aot(model, inputs, partition_fn)
    assert_grads_close(grads, expected)
    (report,) = reports
    assert report.fallback_reason is None
    return report, [n for g in graphs for n in g.graph.nodes]


def _chunks(report) -> int:
    ((_, tokens, vocab, chunks, why, form),) = report.loss_regions
    assert (tokens, vocab, why, form) == (TOKENS[0] * TOKENS[1], VOCAB, None, "forward" if chunks else None)
    return chunks


def test_the_default_leaves_the_loss_as_traced_and_says_why_without_a_peak_budget():
    report, nodes = _step()
    ((_, _, _, chunks, why, _),) = report.loss_regions
    assert chunks == 0 and "peak_budget" in why and report.loss_chunks_tried == ()
    assert any(n.target is LOG_SOFTMAX for n in nodes)


def test_auto_chunks_where_the_simulated_peak_falls():
    report, nodes = _step(loss_chunks="auto")
    chunks = _chunks(report)
    tried = dict((k, peak) for k, peak, _ in report.loss_chunks_tried)
    assert chunks > 1 and tried[chunks] < 0.7 * tried[0]  # chunked, and well below the graph as traced
    assert report.simulated_peak_bytes is not None
    assert report.loss_peak_floor_bytes is not None and report.loss_peak_floor_bytes < tried[chunks]
    assert not any(n.target is LOG_SOFTMAX for n in nodes)


def test_a_peak_budget_in_bytes_takes_the_smallest_count_that_fits():
    tried = {k: peak for k, peak, _ in _step(peak_budget=0.0)[0].loss_chunks_tried}
    assert min(tried, key=tried.get) > 1  # the lowest peak is a chunked one
    budget = (tried[2] + tried[4]) // 2  # 2 chunks miss it, 4 fit
    report, _ = _step(peak_budget=budget)
    assert _chunks(report) == 4
    assert [k for k, _, _ in report.loss_chunks_tried] == [0, 2, 4]



def test_a_budget_the_graph_as_traced_meets_leaves_it_as_traced_and_says_why():
    report, nodes = _step(peak_budget=2**40)
    ((_, _, _, chunks, why, _),) = report.loss_regions
    assert chunks == 0 and "simulated step peaks" in why and [k for k, _, _ in report.loss_chunks_tried] == [0]
    assert any(n.target is LOG_SOFTMAX for n in nodes)

def test_an_explicit_count_is_honoured_and_compared_with_the_graph_as_traced():
    report, nodes = _step(loss_chunks=3, compare_default=True)
    assert _chunks(report) == 3
    assert [k for k, _, _ in report.loss_chunks_tried] == [0, 3]  # 0: as traced
    largest = max(n.meta["val"].numel() for n in nodes if isinstance(n.meta.get("val"), torch.Tensor))
    assert largest < TOKENS[0] * TOKENS[1] * VOCAB  # no full-size logits


def test_a_graph_without_a_loss_region_tries_nothing():
    model, inputs = example("mlp")
    reports = []
    run_aot(model, inputs, fxremat.make_partition_fn(Options.create(compare_default=True), reports))
    assert reports[0].loss_regions == () and reports[0].loss_chunks_tried == ()
    assert reports[0].loss_peak_floor_bytes is None


class Returning(BigVocabLM):
    """The loss and the logits returned, as transformers' ``model(x, labels=y)`` does."""

    def forward(self, ids, labels):
        logits = self.head(self.body(self.embed(ids)))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1)), logits


@pytest.mark.parametrize("chunks", [None, "auto"])
def test_returned_logits_are_chunked_in_backward_where_chosen_with_their_floor(chunks):
    """The logits returned: by default left as traced (no peak_budget), with "auto" chunked in the backward form
    below the graph as traced; the floor counts the logits and their gradient (DESIGN §14)."""
    model, inputs = Returning(), _inputs()
    _, expected = eager_grads(model, inputs, loss=lambda out: out[0])
    reports = []
    partition_fn = fxremat.make_partition_fn(Options.create(strict=True, loss_chunks=chunks), reports)
    _, grads, _ = run_aot(model, inputs, partition_fn, loss=lambda out: out[0])
    assert_grads_close(grads, expected)
    ((_, _, _, chosen, why, form),) = reports[0].loss_regions
    parameters = sum(p.numel() * 4 for p in model.parameters())
    logits = TOKENS[0] * TOKENS[1] * VOCAB * 4
    assert reports[0].loss_peak_floor_bytes == parameters + 2 * logits
    if chunks is None:
        assert chosen == 0 and "peak_budget" in why and form is None and reports[0].loss_chunks_tried == ()
        return
    tried = {k: peak for k, peak, _ in reports[0].loss_chunks_tried}
    assert chosen > 1 and why is None and form == "backward"
    floor = reports[0].loss_peak_floor_bytes
    assert floor <= tried[chosen] < 0.9 * tried[0]  # the floor is 0.75x of the graph as traced here
    assert min(tried.values()) <= 1.1 * floor


@pytest.mark.parametrize("tangent", [False, True])
def test_under_a_peak_budget_returned_logits_are_recomputed_slice_by_slice(tangent):
    """Under ``peak_budget`` the logits-returned form recomputes each slice's logits in backward (budgets may
    recompute a matmul): the returned logits die with forward's outputs, and the lowest peak goes below the floor's
    logits term; the caller's own use of the logits still reaches the parameters."""
    model, inputs = Returning(), _inputs()

    def loss(out):
        return out[0] + (out[1].pow(2).mean() * 1e-3 if tangent else 0)

    _, expected = eager_grads(model, inputs, loss=loss)
    partition_fn, reports, graphs = recording_partition_fn(peak_budget=0.0)
    _, grads, _ = run_aot(model, inputs, partition_fn, loss=loss)
    assert_grads_close(grads, expected)
    ((_, _, _, chosen, why, form),) = reports[0].loss_regions
    tried = {k: peak for k, peak, _ in reports[0].loss_chunks_tried}
    assert chosen > 1 and why is None and form == "backward, logits recomputed"
    from fxremat.render import format_text

    assert "the logits returned: the gradients in backward, logits recomputed" in format_text(reports[0])
    assert tried[chosen] == min(tried.values()) < reports[0].loss_peak_floor_bytes - TOKENS[0] * TOKENS[1] * VOCAB * 4
    saved = [n for n in graphs[0].graph.output_node().args[0][2:] if isinstance(n, torch.fx.Node)]
    assert all(n.meta["val"].numel() < TOKENS[0] * TOKENS[1] * VOCAB for n in saved)  # the logits are not kept


def test_the_text_report_names_the_region_its_chunks_and_the_floor():
    from fxremat.render import format_text

    text = format_text(_step(peak_budget=0.0)[0])
    assert "loss region" in text and "chunks" in text and "as traced" in text and "floor" in text


@pytest.mark.parametrize("chunks", [None, 4, "auto"])
def test_a_symbolic_token_count_is_left_as_traced_and_its_report_is_plain_data(chunks):
    """Dynamic shapes: chunk bounds written for one token count would be wrong at another, so the region is left as
    traced (said, for the user's count), and the report's sizes are the hints, not SymInts (the report store encodes
    every report as JSON: a SymInt there broke the compile)."""
    from helpers import noop_compiler

    from fxremat_passes import _torch_private as tp

    model, inputs = BigVocabLM(), _inputs()
    _, expected = eager_grads(model, inputs, loss=lambda out: out)
    reports = []
    partition_fn = fxremat.make_partition_fn(Options.create(loss_chunks=chunks, compare_default=True), reports)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tp.aot_autograd_as_inductor(partition_fn, noop_compiler), dynamic=True)
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        compiled(*inputs).backward()
    assert_grads_close({n: p.grad for n, p in model.named_parameters()}, expected)
    ((_, tokens, vocab, chosen, why, _),) = reports[0].loss_regions
    assert (type(tokens), tokens, vocab, chosen) == (int, TOKENS[0] * TOKENS[1], VOCAB, 0) and "symbolic" in why
    assert reports[0].fallback_reason is None and '"loss_regions"' in reports[0].to_json()
    assert any("symbolic" in str(w.message) for w in said) == (chunks == 4)


def test_one_chunk_is_told_apart_from_the_graph_as_traced():
    """``loss_chunks=1`` is the rewrite in one chunk (its gradients computed in forward), not the graph as traced."""
    from fxremat.render import format_text

    report, _ = _step(loss_chunks=1, compare_default=True)
    assert _chunks(report) == 1 and [k for k, _, _ in report.loss_chunks_tried] == [0, 1]
    assert "as traced" in format_text(report) and "1 chunks" in format_text(report)
