"""The loss region where the logits are returned (transformers' ``model(x, labels=y)`` returns ``(loss, logits)``):
the loss chunked in forward over slices of the returned logits, the gradients chunked in backward with the logits'
incoming gradient (the tangent) added chunk by chunk (``loss_chunks.BACKWARD``, docs/DESIGN.md §14).  Through
AOTAutograd with no-op compilers, fp32 and bf16, the caller using the logits for nothing (autograd's zero tangent)
or in its own loss term (a nonzero tangent)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers import assert_grads_close, eager_grads, recording_partition_fn, run_aot
from test_loss_chunks import BATCH, CASES, LM, SEQ, VOCAB, _ancestors, _inputs, _regions
from test_loss_chunks_bf16 import BF16_ROUNDING, FORMS, TOKENS, UpcastLM, _errors, compiled_in
from test_loss_chunks_bf16 import _inputs as bf16_inputs

from fxremat_passes.graph.ops import ADD, LOGITS_PASSTHROUGH, TRANSPOSES
from fxremat_passes.rewrite import loss_chunks

# what the caller does with the returned (loss, logits): the loss alone (the logits' gradient is autograd's zero
# tensor), or a term of its own on the logits too (a nonzero gradient the compiled backward must add)
USES = {
    "loss": lambda out: out[0],
    "logits": lambda out: out[0] + out[1].float().pow(2).mean() * 1e-3,
    "alone": lambda out: out,  # a model returning the loss alone
}


def _chunked(model, inputs, use, **settings):
    """(gradients, the report, the forward and backward graphs) of one fxremat step."""
    partition_fn, reports, graphs = recording_partition_fn(**settings)
    _, grads, _ = run_aot(model, inputs, partition_fn, loss=USES[use])
    (report,) = reports
    assert report.fallback_reason is None
    return grads, report, graphs


def test_the_tangent_added_to_the_returned_logits_gradient_is_found():
    (region,) = _regions(LM(returns_logits=True), _inputs())
    assert region.logits_returned and region.backward is not None
    assert region.backward.added.target is ADD and region.backward.tangent.op == "placeholder"
    assert loss_chunks.form_of(region) == loss_chunks.BACKWARD
    (alone,) = _regions(LM(), _inputs())
    assert alone.backward.tangent is None and loss_chunks.form_of(alone) == loss_chunks.FORWARD


def _full_size(graph_module) -> list:
    """The values of the logits' size a graph computes, views and graph inputs left out."""
    return [
        n
        for n in graph_module.graph.nodes
        if n.op == "call_function"
        and isinstance(n.meta.get("val"), torch.Tensor)
        and n.meta["val"].numel() == BATCH * SEQ * VOCAB
        and n.target not in LOGITS_PASSTHROUGH | TRANSPOSES
    ]


@pytest.mark.parametrize("use", ["loss", "logits"])
@pytest.mark.parametrize("chunks", [1, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_returned_logits_chunked_gradients_equal_eager(case, chunks, use):
    kwargs = CASES[case]
    model, inputs = LM(returns_logits=True, **kwargs), _inputs(kwargs.get("ignore_index", -100))
    _, expected = eager_grads(model, inputs, loss=USES[use])
    grads, report, (fw, bw) = _chunked(model, inputs, use, loss_chunks=chunks)
    assert_grads_close(grads, expected)
    ((_, tokens, vocab, chosen, why, form),) = report.loss_regions
    assert (tokens, vocab, chosen, why, form) == (BATCH * SEQ, VOCAB, chunks, None, "backward")
    if chunks == 1:
        return
    # the projection is the one full-size value computed (in forward; the cut may recompute it at this tiny,
    # memory-bound shape): no log-softmax, no softmax, no logits' gradient of the logits' size
    projections = {n.target for n in (*_full_size(fw), *_full_size(bw))}
    assert projections <= {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}, projections
    assert len(_full_size(fw)) == 1


def test_chunks_of_the_backward_run_one_after_another():
    """The backward runs in column slices of the vocabulary, each slice's rows of the head weight's gradient joined:
    slice i+1's logits read an exact zero from slice i's gradients and from the loss's incoming gradient
    (``loss_chunks._after``): all in backward, one slice at a time."""
    _, _, (_, bw) = _chunked(LM(returns_logits=True), _inputs(), "loss", loss_chunks=3)
    mms = [n for n in bw.graph.nodes if n.target is torch.ops.aten.mm.default]
    rows = [n for n in mms if tuple(n.args[0].meta["val"].shape) == (VOCAB // 3, BATCH * SEQ)]  # slice^T @ hidden
    assert len(rows) == 3
    for before, after in zip(rows, rows[1:]):
        assert before in _ancestors(after)


class ReturningUpcastLM(UpcastLM):
    """The bf16 LM head, the loss in fp32, the bf16 logits returned beside it."""

    def forward(self, ids, labels):
        logits = self.head(self.body(self.embed(ids)))
        if self.loss == "hf":
            from transformers.loss.loss_utils import ForCausalLMLoss

            return ForCausalLMLoss(logits, labels, VOCAB_BF16), logits
        return torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB_BF16), labels.view(-1)), logits


VOCAB_BF16 = 2048  # test_loss_chunks_bf16's


def _bf16_step(model, form, use, **settings):
    """(gradients, the report, the graphs) of one step through aot_module in ``form`` with fxremat's ``settings``;
    eager's gradients (and None, []) without settings."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    if not settings:
        USES[use](model(*bf16_inputs())).backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters()}, None, []
    partition_fn, reports, graphs = recording_partition_fn(**settings)
    USES[use](compiled_in(model, form, partition_fn)(*bf16_inputs())).backward()
    (report,) = reports
    assert report.fallback_reason is None
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}, report, graphs


@pytest.mark.parametrize("use", ["loss", "logits"])
@pytest.mark.parametrize(("loss", "bias"), [("upcast", False), ("hf", True)])
@pytest.mark.parametrize("form", FORMS)
def test_returned_bf16_logits_chunked_match_eager_to_bf16_rounding(form, loss, bias, use):
    """The bf16 gradients against an fp32 step from the same values, within twice the worse of eager bf16's and the
    graph as traced's error plus one bf16 rounding (test_loss_chunks_bf16's bound)."""
    model = ReturningUpcastLM(loss, bias).to(torch.bfloat16)
    master, _, _ = _bf16_step(copy.deepcopy(model).float(), form, use)  # the same bf16 values, stepped in fp32
    eager, _, _ = _bf16_step(model, form, use)
    traced, _, _ = _bf16_step(model, form, use, loss_chunks=0)
    grads, report, _ = _bf16_step(model, form, use, loss_chunks=4)
    ((_, tokens, vocab, chosen, why, chunked_form),) = report.loss_regions
    assert (tokens, vocab, chosen, why, chunked_form) == (TOKENS[0] * TOKENS[1], VOCAB_BF16, 4, None, "backward")
    assert {n: g.dtype for n, g in grads.items()} == {n: p.dtype for n, p in model.named_parameters()}
    bound = 2 * max(max(_errors(eager, master).values()), max(_errors(traced, master).values())) + BF16_ROUNDING
    errors = _errors(grads, master)
    assert all(e <= bound for e in errors.values()), (errors, bound)


class TiedLM(torch.nn.Module):
    """fp32, the head tied to the embedding (GPT-2's), returning the loss alone or with the logits."""

    def __init__(self, returns):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB_BF16, 32)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
        self.returns = returns

    def forward(self, ids, labels):
        logits = torch.nn.functional.linear(self.body(self.embed(ids)), self.embed.weight)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB_BF16), labels.view(-1))
        return (loss, logits) if self.returns else loss


@pytest.mark.parametrize("use", ["alone", "logits"])
@pytest.mark.parametrize("form", ["inductor", "inductor_passes"])
def test_a_tied_heads_gradient_is_summed_into_the_embeddings_scatter(form, use):
    """Inductor's decomposed embedding backward scatters into zeros and the head's gradient is added after: chunked,
    the scatter adds into the head's gradient (``loss_chunks._into_embedding_gradient``), one weight-sized buffer."""
    model = TiedLM(returns=use != "alone")
    expected, _, _ = _bf16_step(model, form, use)
    grads, report, graphs = _bf16_step(model, form, use, loss_chunks=4)
    assert_grads_close(grads, expected)
    assert report.loss_regions[0][3] == 4
    bw = graphs[1].graph
    (scatter,) = [n for n in bw.nodes if n.target in loss_chunks.EMBEDDING_SCATTERS]  # torch 2.11's is index_put
    assert scatter.args[0].target is not torch.ops.aten.full.default  # into the head's gradient, not zeros


def test_a_broken_tangent_is_caught(monkeypatch):
    """The tangent's slice is what makes the caller's own use of the logits reach the parameters: left out, the
    gradients differ from eager's (the tests above would catch a rewrite that dropped it)."""
    model, inputs = LM(returns_logits=True), _inputs()
    _, expected = eager_grads(model, inputs, loss=USES["logits"])
    real = loss_chunks._chunked_backward

    def without_tangent(emit, region, *args):
        backward = dataclasses.replace(region.backward, tangent=None)
        return real(emit, dataclasses.replace(region, backward=backward), *args)

    monkeypatch.setattr(loss_chunks, "_chunked_backward", without_tangent)
    grads, _, _ = _chunked(model, inputs, "logits", loss_chunks=3)
    with pytest.raises(AssertionError):
        assert_grads_close(grads, expected)
