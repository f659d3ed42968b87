"""``loss_chunks`` under real Inductor (issue #55, docs/DESIGN.md §14): the loss region is found as Inductor's
decompositions leave it and runs in chunks, and every gradient equals eager's.  Each compile is about 30 s of C++
here."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxremat

pytestmark = pytest.mark.inductor

VOCAB, HIDDEN, TOKENS = 512, 32, 64


class PlainLM(nn.Module):
    """Embedding, a body, a biased LM head and ``F.cross_entropy`` with a custom ``ignore_index``, summed."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.body(self.embed(ids))))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), reduction="sum", ignore_index=5)


class LlamaLoss(nn.Module):
    """transformers' LlamaForCausalLM with ``labels=``, returning the loss alone (its ForCausalLMLoss: the labels
    shifted by padding, -100 ignored, a mean)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            use_cache=False,
        )
        self.model = LlamaForCausalLM(config)

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def _compiled_step(model, chunks, *inputs):
    """(the compiled loss, the reports, the warnings) of one step, and the eager copy's loss and gradients."""
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    expected = eager(*inputs)
    expected.backward()
    backend = fxremat.backend(loss_chunks=chunks, strict=True, compare_default=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(model, backend=backend)(*inputs)
        loss.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)  # every parameter's gradient, against eager
    return backend.reports, [str(w.message) for w in caught if "loss_chunks" in str(w.message)]


def test_plain_cross_entropy_runs_in_chunks_under_inductor():
    torch.manual_seed(0)
    ids, labels = torch.randint(0, VOCAB, (1, TOKENS)), torch.randint(0, VOCAB, (1, TOKENS))
    labels[0, :7] = 5
    reports, said = _compiled_step(PlainLM(), 4, ids, labels)
    (report,) = reports
    assert [row[1:4] for row in report.loss_regions] == [(TOKENS, VOCAB, 4)] and not said
    assert report.fallback_reason is None


def test_transformers_llama_loss_runs_in_chunks_under_inductor():
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    labels = ids.clone()
    labels[0, :5] = -100
    reports, said = _compiled_step(LlamaLoss(), 3, ids, labels)  # 64 tokens in 3 uneven chunks
    (report,) = reports
    assert [row[1:4] for row in report.loss_regions] == [(TOKENS, VOCAB, 3)] and not said
    assert report.fallback_reason is None


def test_transformers_llama_loss_in_bf16_runs_in_chunks_under_inductor():
    """bf16, the logits upcast to fp32 by transformers' loss (docs/DESIGN.md §14).  Inductor computes bf16 pointwise
    ops in fp32 and eager does not, so neither is exact: each gradient is compared with eager's relative to its
    largest entry, within 2^-6 (four bf16 roundings, torch.testing's own bf16 rtol)."""
    from fxremat.measure import max_relative_error

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    labels = ids.clone()
    labels[0, :5] = -100
    model = LlamaLoss().to(torch.bfloat16)
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    eager(ids, labels).backward()
    backend = fxremat.backend(loss_chunks=3, strict=True, compare_default=False)
    torch.compile(model, backend=backend)(ids, labels).backward()
    (report,) = backend.reports
    assert [row[1:5] for row in report.loss_regions] == [(TOKENS, VOCAB, 3, None)]
    assert report.fallback_reason is None
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad.dtype == torch.bfloat16
        assert max_relative_error(p.grad.float(), q.grad.float()) <= 2.0**-6, name


def test_transformers_llama_with_its_logits_returned_runs_in_chunks_under_inductor():
    """``model(x, labels=y)`` returns the loss and the logits; the caller's own term on the logits sends backward a
    nonzero gradient for them, which the chunked backward adds chunk by chunk (docs/DESIGN.md §14)."""

    class Returning(LlamaLoss):
        def forward(self, ids, labels):
            out = self.model(input_ids=ids, labels=labels)
            return out.loss, out.logits

    def caller_loss(out):
        return out[0] + out[1].float().pow(2).mean() * 1e-3

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    labels = ids.clone()
    labels[0, :5] = -100
    model = Returning()
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    expected = eager(ids, labels)
    caller_loss(expected).backward()
    backend = fxremat.backend(loss_chunks=3, strict=True, compare_default=False)
    out = torch.compile(model, backend=backend)(ids, labels)
    caller_loss(out).backward()
    torch.testing.assert_close(out, expected)
    (report,) = backend.reports
    assert [row[1:6] for row in report.loss_regions] == [(TOKENS, VOCAB, 3, None, "backward")]
    assert report.fallback_reason is None
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
