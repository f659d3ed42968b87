"""The loss region in bf16 with the fp32 upcast users write (``F.cross_entropy(logits.float(), y)``, transformers'
``ForCausalLMLoss``): found as ATen ops and as Inductor's decompositions leave it (casts between the head and the
log-softmax, the gradient cast back to bf16 before the head's backward), and chunked with the traced graph's dtypes
at every step (docs/DESIGN.md §14).  Through AOTAutograd with no-op compilers.

Tolerance: bf16 keeps 8 significant bits, so eager's own gradients sit up to a few 2^-8 (relative to the gradient's
largest entry) from the exact ones.  Each test measures that error for eager bf16 and for the graph as traced
(``loss_chunks=0``) against an fp32 step from the same bf16 values (the fp32 master), and asks the chunked graph to
be no further from it than twice the worse of them plus one bf16 rounding, 2^-8: the chunks round each chunk's
weight-gradient part once to bf16 (the traced matmul rounds its sum once), which is the one rounding allowed."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import aot_module
from helpers import noop_compiler, recording_partition_fn

from fxremat.measure import max_relative_error
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.cse import prepare_joint_graph
from fxremat_passes.graph.loss_region import find_loss_regions
from fxremat_passes.graph.ops import LOG_SOFTMAX, MUL, SCATTER_VALUE, SUB, WHERE

VOCAB, HIDDEN, TOKENS = 2048, 32, (4, 128)  # logits 2 MiB in bf16 beside 0.1 MiB of parameters: the peak at the loss
BF16_ROUNDING = 2.0**-8
# aot_module as it traces; with Inductor's decompositions (functionalization's aliases before the backward's exp);
# and with Inductor's joint-graph passes too, as torch.compile runs them (the one-hot scatter rewritten as a where)
FORMS = ("aten", "inductor", "inductor_passes")


class UpcastLM(torch.nn.Module):
    """Embedding -> a small body -> bf16 LM head -> the loss in fp32 (``logits.float()``, or transformers')."""

    def __init__(self, loss="upcast", bias=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.body = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh())
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=bias)
        self.loss = loss

    def forward(self, ids, labels):
        logits = self.head(self.body(self.embed(ids)))
        if self.loss == "hf":
            from transformers.loss.loss_utils import ForCausalLMLoss

            return ForCausalLMLoss(logits, labels, VOCAB)
        return F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))


def _inputs():
    torch.manual_seed(1)
    ids, labels = torch.randint(0, VOCAB, TOKENS), torch.randint(0, VOCAB, TOKENS)
    labels[0, :3] = -100
    return ids, labels


class _Partitioner(tp.CustomPartitionerFn):
    """``partition_fn`` as Inductor's ``custom_partitioner_fn`` takes it (Inductor names its compiler too)."""

    def __init__(self, partition_fn):
        self.partition_fn = partition_fn

    def __call__(self, gm, joint_inputs, compiler=None, **kwargs):
        return self.partition_fn(gm, joint_inputs, **kwargs)

    def uuid(self):
        return None  # not cached


def compiled_in(model, form, partition_fn):
    """``model`` through aot_module in ``form`` (the joint as traced, decomposed, or through Inductor's joint-graph
    passes) with ``partition_fn`` and no-op compilers."""
    decompositions = tp.inductor_decompositions() if form != "aten" else None
    partition_fn = (
        tp.after_inductor_joint_passes(_Partitioner(partition_fn)) if form == "inductor_passes" else partition_fn
    )
    return aot_module(
        model,
        fw_compiler=noop_compiler,
        bw_compiler=noop_compiler,
        partition_fn=partition_fn,
        decompositions=decompositions,
    )


def _step(model, form, partition_fn):
    """The parameters' gradients of one step through aot_module in ``form``."""
    compiled = compiled_in(model, form, partition_fn)
    model.zero_grad(set_to_none=True)
    compiled(*_inputs()).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _fxremat_step(model, form, **settings):
    """(gradients, the report, the graphs' nodes) of one fxremat step."""
    partition_fn, reports, graphs = recording_partition_fn(**settings)

    grads = _step(copy.deepcopy(model), form, partition_fn)
    (report,) = reports
    assert report.fallback_reason is None
    return grads, report, [n for g in graphs for n in g.graph.nodes]


def _eager(model):
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    model(*_inputs()).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _errors(grads, reference) -> dict[str, float]:
    return {n: max_relative_error(grads[n].float(), reference[n]) for n in reference}


@pytest.mark.parametrize("loss", ["upcast", "hf"])
@pytest.mark.parametrize("form", FORMS)
def test_the_bf16_region_with_its_upcast_is_found(form, loss):
    captured = []

    def partition_fn(joint, joint_inputs, **kwargs):
        captured.append(find_loss_regions(prepare_joint_graph(joint).graph))
        from torch._functorch.partitioners import default_partition

        return default_partition(joint, joint_inputs, **kwargs)

    _step(UpcastLM(loss).to(torch.bfloat16), form, partition_fn)
    (region,) = captured[0]
    assert region.projection.meta["val"].dtype == torch.bfloat16 and region.compute_dtype == torch.float32
    assert not region.logits_returned and region.backward is not None
    assert region.backward.grad_weight is not None and region.backward.grad_hidden is not None


@pytest.mark.parametrize(("loss", "bias"), [("upcast", False), ("hf", True)])
@pytest.mark.parametrize("chunks", [3, 4, "auto"])
@pytest.mark.parametrize("form", FORMS)
def test_chunked_bf16_gradients_match_eager_to_bf16_rounding(form, chunks, loss, bias):
    """An explicit count is honoured; "auto" chunks, its simulated peak below the graph as traced."""
    model = UpcastLM(loss, bias).to(torch.bfloat16)
    master = _eager(copy.deepcopy(model).float())  # the same bf16 values, stepped in fp32
    eager = _errors(_eager(model), master)
    traced, traced_report, _ = _fxremat_step(model, form, loss_chunks=0)
    assert traced_report.loss_chunks_tried == ()
    grads, report, nodes = _fxremat_step(model, form, loss_chunks=chunks)
    assert {n: g.dtype for n, g in grads.items()} == {n: p.dtype for n, p in model.named_parameters()}
    ((_, tokens, vocab, chosen, why, chunked_form),) = report.loss_regions
    assert (tokens, vocab, why, chunked_form) == (TOKENS[0] * TOKENS[1], VOCAB, None, "forward")
    if chunks == "auto":
        tried = {k: peak for k, peak, _ in report.loss_chunks_tried}
        assert chosen > 1 and tried[chosen] < 0.8 * tried[0]
    else:
        assert chosen == chunks
    log_softmax = LOG_SOFTMAX if form == "aten" else SUB
    assert not any(n.target is log_softmax and n.meta["val"].numel() == tokens * vocab for n in nodes)
    bound = 2 * max(max(eager.values()), max(_errors(traced, master).values())) + BF16_ROUNDING
    errors = _errors(grads, master)
    assert all(e <= bound for e in errors.values()), (errors, bound, eager)
    # the bf16 eager step itself, to the same bound
    assert all(max_relative_error(grads[n].float(), g.float()) <= bound for n, g in _eager(model).items())


@pytest.mark.parametrize("form", ["inductor", "inductor_passes"])
def test_a_product_other_than_the_one_hot_gives_no_backward(form):
    """The decomposed NLL's gradient is the one-hot (a scatter, or a where(eq(iota)) after Inductor's joint passes)
    times the masked incoming gradient: any other factor there (doubled here) is a loss the rewrite would not
    reproduce, so the region's backward is unknown (``loss_region._is_one_hot``)."""
    captured = []

    def partition_fn(joint, joint_inputs, **kwargs):
        captured.append(prepare_joint_graph(joint))
        from torch._functorch.partitioners import default_partition

        return default_partition(joint, joint_inputs, **kwargs)

    _step(UpcastLM().to(torch.bfloat16), form, partition_fn)
    graph = captured[0].graph
    logits = (TOKENS[0] * TOKENS[1], VOCAB)
    (one_hot,) = [
        n
        for n in graph.nodes
        if n.target in (SCATTER_VALUE, WHERE)
        and tuple(n.meta["val"].shape) == logits
        and any(u.target is MUL for u in n.users)
    ]
    assert find_loss_regions(graph)[0].backward is not None
    with graph.inserting_after(one_hot):
        doubled = graph.call_function(MUL, (one_hot, 2.0))
    doubled.meta["val"] = one_hot.meta["val"] * 2.0
    one_hot.replace_all_uses_with(doubled, delete_user_cb=lambda u: u is not doubled)
    (region,) = find_loss_regions(graph)
    assert region.backward is None


def test_many_chunks_add_no_rounding_to_the_head_gradient():
    """The chunks' parts of the head's gradient are summed in fp32 (``loss_chunks._accumulate``): at 64 chunks a
    bf16 running sum would round 63 times and land beyond the bound; in fp32 the error is that of a few chunks."""
    model = UpcastLM().to(torch.bfloat16)
    master = _eager(copy.deepcopy(model).float())
    traced, _, _ = _fxremat_step(model, "aten", loss_chunks=0)
    bound = 2 * max(max(_errors(_eager(model), master).values()), max(_errors(traced, master).values()))
    grads, report, _ = _fxremat_step(model, "aten", loss_chunks=64)
    assert report.loss_regions[0][3] == 64
    assert _errors(grads, master)["head.weight"] <= bound + BF16_ROUNDING


def test_inductors_auto_chunker_composes_and_loss_chunks_says_it_found_nothing_left():
    """Inductor's opt-in auto-chunker runs in its joint-graph passes, before fxremat's partition: the loss arrives
    chunked (``invoke_subgraph``), the gradients stay eager's, and ``loss_chunks`` says why it chunked nothing."""
    from torch._inductor import config as inductor_config

    model = UpcastLM()  # fp32: the chunker's amplifier test passes at this head (hidden 32 -> vocabulary 2048)
    expected = _eager(model)
    with inductor_config.patch({"auto_chunker.enable": True}), pytest.warns(UserWarning, match="auto_chunker is on"):
        grads, report, nodes = _fxremat_step(model, "inductor_passes", loss_chunks=4)
    assert any("invoke_subgraph" in str(n.target) for n in nodes)  # the chunker fired
    assert report.loss_regions == ()
    assert max(_errors(grads, expected).values()) < 1e-5
