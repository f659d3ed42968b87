"""The loss region (``passes/graph/loss_region.py``) and its chunked rewrite (``passes/rewrite/loss_chunks.py``,
docs/DESIGN.md §14), through AOTAutograd with no-op compilers: the region is found in the forms users write and
nowhere else, and the chunked step's gradients equal eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_grads_close, capture_joint, eager_grads, run_aot
from torch._functorch.partitioners import default_partition

import fxremat
from fxremat import partition as partition_module
from fxremat.examples import EXAMPLES, example
from fxremat.options import Options
from fxremat_passes.graph.cse import prepare_joint_graph
from fxremat_passes.graph.loss_region import find_loss_regions
from fxremat_passes.graph.ops import LOG_SOFTMAX

VOCAB, HIDDEN, BATCH, SEQ = 96, 24, 2, 10


class LM(nn.Module):
    """Embedding -> a small body -> LM head -> a loss of ``form``; returns the loss (and the logits, ``returns``)."""

    def __init__(self, form="mean", tied=False, bias=False, ignore_index=-100, returns_logits=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.head = None if tied else nn.Linear(HIDDEN, VOCAB, bias=bias)  # tied: the embedding's weight is the head's
        self.form, self.ignore_index, self.returns_logits = form, ignore_index, returns_logits

    def forward(self, ids, labels):
        hidden = self.body(self.embed(ids))
        logits = F.linear(hidden, self.embed.weight) if self.head is None else self.head(hidden)
        if self.form == "hf":
            from transformers.loss.loss_utils import ForCausalLMLoss

            loss = ForCausalLMLoss(logits, labels, VOCAB)
        else:
            loss = F.cross_entropy(
                logits.view(-1, VOCAB), labels.view(-1), reduction=self.form, ignore_index=self.ignore_index
            )
        return (loss, logits) if self.returns_logits else loss


def _inputs(ignore_index=-100):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels[0, :3] = ignore_index
    return ids, labels


def _loss(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _regions(model, inputs):
    captured = []

    def partition_fn(joint, joint_inputs, **kwargs):
        captured.append(find_loss_regions(prepare_joint_graph(joint).graph))
        return default_partition(joint, joint_inputs, **kwargs)

    run_aot(model, inputs, partition_fn, loss=_loss)
    return captured[0]


CASES = {
    "mean": {},
    "sum": {"form": "sum"},
    "ignore_index": {"ignore_index": 5},
    "hf": {"form": "hf", "bias": True},
    "tied": {"tied": True},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_loss_region_is_found(case):
    model, kwargs = LM(**CASES[case]), CASES[case]
    (region,) = _regions(model, _inputs(kwargs.get("ignore_index", -100)))
    tokens = BATCH * SEQ
    assert (region.tokens, region.vocab) == (tokens, VOCAB)
    assert region.reduction == ("sum" if case == "sum" else "mean")
    assert region.ignore_index == kwargs.get("ignore_index", -100)
    assert not region.logits_returned and region.backward is not None
    assert (region.bias is not None) == kwargs.get("bias", False)
    assert region.backward.grad_weight is not None and region.backward.grad_hidden is not None


def test_returned_logits_are_seen():
    (region,) = _regions(LM(returns_logits=True), _inputs())
    assert region.logits_returned


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_loss_region_without_a_cross_entropy(name):
    model, inputs = example(name)
    assert find_loss_regions(prepare_joint_graph(capture_joint(model, inputs)[0]).graph) == []


def _chunked_step(model, inputs, chunks):
    """(grads, every tensor size the forward and backward graphs make) of one step with ``loss_chunks``."""
    reports, graphs = [], []
    inner = fxremat.make_partition_fn(Options.create(loss_chunks=chunks, strict=True), reports)

    def partition_fn(joint, joint_inputs, **kwargs):
        fw, bw = inner(joint, joint_inputs, **kwargs)
        graphs.extend((fw, bw))
        return fw, bw

    _, grads, _ = run_aot(model, inputs, partition_fn, loss=_loss)
    assert len(reports) == 1 and reports[0].fallback_reason is None
    return grads, graphs


@pytest.mark.parametrize("chunks", [1, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_gradients_equal_eager(case, chunks):
    kwargs = CASES[case]
    model, inputs = LM(**kwargs), _inputs(kwargs.get("ignore_index", -100))
    _, expected = eager_grads(model, inputs, loss=_loss)
    grads, graphs = _chunked_step(model, inputs, chunks)
    assert_grads_close(grads, expected)
    if kwargs.get("tied"):
        assert set(grads) == {"embed.weight", "body.0.weight", "body.0.bias"}  # one parameter, one gradient
    nodes = [n for g in graphs for n in g.graph.nodes]
    assert not any(n.target is LOG_SOFTMAX for n in nodes)  # the traced loss is gone
    largest = max(n.meta["val"].numel() for n in nodes if isinstance(n.meta.get("val"), torch.Tensor))
    rows = -(-BATCH * SEQ // chunks)
    assert largest <= max(rows * VOCAB, VOCAB * HIDDEN)  # no full-size logits (one chunk's at most)



def _ancestors(node) -> set:
    seen, todo = set(), list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += n.all_input_nodes
    return seen


def test_each_chunk_waits_for_the_previous_chunks_gradients():
    """Chunk i+1's logits read an exact zero from chunk i's gradients (``loss_chunks._after``): no scheduler or
    reordering pass can run two chunks' full-width values at once (docs/DESIGN.md §14)."""
    model, inputs = LM(), _inputs()
    _, graphs = _chunked_step(model, inputs, 4)
    fw = graphs[0].graph
    logits = [n for n in fw.nodes if n.target is torch.ops.aten.mm.default and n.meta["val"].shape[-1] == VOCAB]
    assert len(logits) == 4
    for before, after in zip(logits, logits[1:]):
        assert before in _ancestors(after)


def test_a_fault_after_the_rewrite_falls_back_with_correct_gradients():
    """The rewrite works on the joint in place: a later pass's failure hands PyTorch's partitioner the chunked joint,
    which computes the same function."""
    model, inputs = LM(form="sum"), _inputs()
    _, expected = eager_grads(model, inputs, loss=_loss)
    reports = []
    partition_fn = fxremat.make_partition_fn(Options.create(loss_chunks=3), reports)
    with partition_module.inject_fault("classify"), pytest.warns(partition_module.FxrematFallbackWarning):
        _, grads, _ = run_aot(model, inputs, partition_fn, loss=_loss)
    assert reports[0].fallback_reason is not None
    assert_grads_close(grads, expected)


@pytest.mark.parametrize("compare", [False, True])  # a report-oriented run (or report_dir) says it too
def test_a_graph_without_a_loss_region_says_loss_chunks_did_nothing(compare):
    model, inputs = example("mlp")
    reports = []
    partition_fn = fxremat.make_partition_fn(Options.create(loss_chunks=4, compare_default=compare), reports)
    with pytest.warns(UserWarning, match="no LM head and cross-entropy in it"):
        run_aot(model, inputs, partition_fn)
    assert reports and reports[0].fallback_reason is None


def test_label_smoothing_is_left_as_traced_and_said():
    """Another term reads the log-softmax: the region is not the plain cross-entropy, never chunked without it."""

    class Smoothed(LM):
        def forward(self, ids, labels):
            logits = self.head(self.body(self.embed(ids)))
            return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), label_smoothing=0.1)

    model, inputs = Smoothed(), _inputs()
    _, expected = eager_grads(model, inputs, loss=_loss)
    with pytest.warns(UserWarning, match="loss_chunks=4 left .* as traced"):
        grads, _ = _chunked_step(model, inputs, 4)
    assert_grads_close(grads, expected)


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), (-2, ValueError), (True, TypeError), ("4", TypeError)])
def test_loss_chunks_is_validated(value, error):
    with pytest.raises(error, match="loss_chunks"):
        Options.create(loss_chunks=value)


def test_loss_chunks_defaults_to_none_and_each_setting_is_in_the_cache_key():
    """None (chosen under a peak_budget only), "auto", 0 and a count each make other graphs: no two share a key."""
    settings = (None, "auto", 0, 4)
    assert Options.create().loss_chunks is None
    assert len({Options.create(loss_chunks=s).cache_key() for s in settings}) == len(settings)
