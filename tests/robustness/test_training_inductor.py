"""Training loops through real Inductor with fxremat (strict): AdamW steps with gradient accumulation against eager,
BatchNorm running stats, checkpoint regions with and without SAC policies, eval/no_grad after training, autocast
to bf16, and a SAC policy that tags dropout MUST_RECOMPUTE.

A cold Inductor compile costs 5-60 s on this machine, so ONE model is compiled once (module-scoped fixture) and
every test reads what that run recorded: the training graph, then the inference graph (eval + no_grad), then the
autocast graph, in that order, on the same compiled module.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
from robust_helpers import TaggedDropout, close_scaled
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import fxremat

pytestmark = pytest.mark.inductor

# Inductor reorders fp32 reductions and AdamW divides by sqrt(v): measured here, parameters after 3 steps are 6e-7
# (relative) from eager and gradients 4e-7; a wrong gradient is off by O(1).
TRAIN_RTOL = 1e-4
# bf16 keeps 8 bits of mantissa and Inductor rounds at other points than eager (fused pointwise chains stay fp32):
# measured 1.25e-2 on blocks.0.fc1.bias, so 2e-2 would sit too close.
AUTOCAST_RTOL = 5e-2
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def _policy(kind, ctx, op, *args, **kwargs):
    if kind == "save_matmuls":  # the usual SAC recipe: keep the matmuls, recompute the rest
        return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE
    return kind


def _context(kind):
    # Dynamo needs a functools.partial (not a lambda) as context_fn
    return functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, kind))


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return self.fc2(torch.sin(self.fc1(x)))


# blocks.0: plain checkpoint (under torch.compile, every op tagged PREFER_RECOMPUTE); blocks.1: SAC, matmuls
# MUST_SAVE and the rest PREFER_RECOMPUTE; blocks.2: SAC, everything MUST_RECOMPUTE.  (A fourth region would cost
# seconds of C++ compile and test nothing new.)
REGIONS = (None, "save_matmuls", CheckpointPolicy.MUST_RECOMPUTE)


class Net(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        # no bias before BatchNorm: its gradient is zero up to rounding, and AdamW would amplify that noise
        self.inp, self.bn = nn.Linear(8, dim, bias=False), nn.BatchNorm1d(dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in REGIONS)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        h = self.bn(self.inp(x))
        for block, kind in zip(self.blocks, REGIONS):
            if kind is None:
                h = h + checkpoint(block, h, use_reentrant=False)
            else:
                h = h + checkpoint(block, h, use_reentrant=False, context_fn=_context(kind))
        return self.head(h)


def _loss(out, micro_batches: int = 2):
    return out.float().square().mean() / micro_batches


def _errors(actual: dict, expected: dict, rtol: float) -> dict:
    errors = {k: close_scaled(actual[k], expected[k], rtol) for k in expected}
    return {k: e for k, e in errors.items() if e is not None}


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


class Run:
    """Everything the compiled model and its eager twin did, recorded once."""

    def __init__(self):
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        self.model = Net()
        self.eager = copy.deepcopy(self.model)
        self.backend = fxremat.backend(strict=True)
        self.compiled = torch.compile(self.model, backend=self.backend)
        batches = [[torch.randn(6, 8, generator=generator) for _ in range(2)] for _ in range(3)]
        self.losses, self.expected_losses = [], []
        self.first_grads = self.expected_first_grads = None
        for fn, model, losses in (
            (self.compiled, self.model, self.losses),
            (self.eager, self.eager, self.expected_losses),
        ):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
            for step, micro in enumerate(batches):
                for x in micro:  # gradient accumulation over 2 micro-batches
                    loss = _loss(fn(x))
                    loss.backward()
                    losses.append(loss.item())
                if step == 0:
                    if model is self.model:
                        self.first_grads = _grads(model)
                    else:
                        self.expected_first_grads = _grads(model)
                opt.step()
                opt.zero_grad(set_to_none=True)
        self.reports_after_training = len(self.backend.reports)
        # eval + no_grad with the same compiled module: a new (inference) graph, running stats used
        x = torch.randn(5, 8, generator=generator)
        self.model.eval(), self.eager.eval()
        with torch.no_grad():
            self.eval_out, self.expected_eval_out = self.compiled(x), self.eager(x)
        self.model.train(), self.eager.train()
        self.reports_after_eval = len(self.backend.reports)
        self.x_autocast = torch.randn(6, 8, generator=generator)


_run: dict[str, Run] = {}


@pytest.fixture(scope="module")
def run() -> Run:
    if "run" not in _run:
        _run["run"] = Run()
    return _run["run"]


def test_accumulated_gradients_match_eager(run):
    assert not _errors(run.first_grads, run.expected_first_grads, TRAIN_RTOL)


def test_adamw_steps_match_eager(run):
    assert max(abs(a - b) / abs(b) for a, b in zip(run.losses, run.expected_losses)) < TRAIN_RTOL
    assert not _errors(_params(run.model), _params(run.eager), TRAIN_RTOL)
    buffers = dict(run.model.named_buffers())
    assert not _errors(buffers, dict(run.eager.named_buffers()), TRAIN_RTOL)  # BatchNorm stats after 6 forwards
    # not vacuous: training moved every parameter well beyond the tolerance
    assert set(_errors(_params(run.model), _initial_params(), TRAIN_RTOL)) == set(_params(run.model))


def _initial_params():
    torch.manual_seed(0)
    return _params(Net())


def test_one_partition_for_all_training_steps(run):
    assert run.reports_after_training == 1
    assert run.backend.reports[0].fallback_reason is None


def test_eval_no_grad_after_training(run):
    assert close_scaled(run.eval_out, run.expected_eval_out, TRAIN_RTOL) is None
    assert run.reports_after_eval == run.reports_after_training  # inference graphs are not partitioned


def test_sac_policies_are_honoured(run):
    report = run.backend.reports[0]
    # blocks.1 (matmuls MUST_SAVE): both its matmuls are saved, whatever they cost
    saved_matmuls = [r for r in report.saved if (r.module or "").startswith("blocks.1.") and r.op == "aten.addmm"]
    assert len(saved_matmuls) == 2, [(r.name, r.op, r.module) for r in report.saved]
    assert any("MUST_SAVE" in reason for reason, _ in report.never_recomputed)
    # blocks.2 (MUST_RECOMPUTE): nothing of it is saved; its matmuls and sin are recomputed, as tagged
    assert not [r for r in report.saved if (r.module or "").startswith("blocks.2.")]
    tagged = {name for name, why in report.recompute_reasons if why == "tagged MUST_RECOMPUTE"}
    recomputed_ops = {r.name: r.op for r in report.recomputed}
    assert {"aten.addmm", "aten.sin"} <= {recomputed_ops[n] for n in tagged}
    # PREFER_RECOMPUTE (blocks.0 and blocks.1's non-matmuls): the user's plan is a ceiling (checkpoints="honour",
    # passes/choice/contract.py): recomputed as tagged, or kept only where that saves no more and peaks no higher
    assert any(why == "tagged PREFER_RECOMPUTE, honoured" for _, why in report.recompute_reasons)
    assert report.saved_bytes <= report.user_plan_saved_bytes
    assert all(why.startswith(("re-planned", "never")) for _, why in report.checkpoint_kept), report.checkpoint_kept
    assert not report.tag_conflicts


@pytest.fixture(scope="module")
def autocast_run(run):
    """One bf16-autocast step on the trained model (a third graph), and the same in eager."""
    results = {}
    for name, fn, model in (("compiled", run.compiled, run.model), ("eager", run.eager, run.eager)):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(run.x_autocast)
        _loss(out, 1).backward()
        results[name] = (out.detach().float(), _grads(model))
    return results


def test_autocast_bf16_step_matches_eager(run, autocast_run):
    (out, grads), (expected_out, expected_grads) = autocast_run["compiled"], autocast_run["eager"]
    assert close_scaled(out, expected_out, AUTOCAST_RTOL) is None
    assert not _errors(grads, expected_grads, AUTOCAST_RTOL)
    report = run.backend.reports[-1]
    assert len(run.backend.reports) == 2 and report.fallback_reason is None
    assert any(row.dtype == "bfloat16" for row in report.saved), "autocast's bf16 activations are what is saved"


# --- SAC tags dropout MUST_RECOMPUTE ------------------------------------------------------------------------------


def test_sac_must_recompute_on_dropout_keeps_the_mask():
    """Under Inductor, dropout is inductor_seeds + inductor_random: the seed is saved (never recomputed: it would
    change the stream) and the draw may be replayed from it, exactly.  The tag then asks nothing unsafe, so no
    tag conflict; the gradient identity proves the replay drew the same mask."""
    torch.manual_seed(0)
    model, backend = TaggedDropout(), fxremat.backend(strict=True, memory_price=1e6)
    x = torch.randn(8, 32)
    y = torch.compile(model, backend=backend)(x)
    y.sum().backward()
    assert 0.2 < (y == 0).float().mean().item() < 0.8  # dropout really dropped
    implied = (y.detach() / model.w.detach()).sum(0)
    assert close_scaled(model.w.grad, implied, 1e-5) is None
    (report,) = backend.reports
    assert any("seed" in reason for reason, _ in report.never_recomputed), report.never_recomputed
    assert {r.op for r in report.saved} >= {"prims.inductor_seeds"}
    recomputed = {r.op for r in report.recomputed}
    assert not recomputed & {"aten.native_dropout", "aten.bernoulli", "aten.rand", "prims.inductor_seeds"}


def test_sac_must_recompute_on_dropout_with_fallback_random():
    """Inductor with fallback_random keeps aten.native_dropout, and the tag now asks to redraw it: safety wins, the
    draw is never recomputed, and the report says that the tag was overridden."""
    torch.manual_seed(0)
    model = TaggedDropout()
    before = len(fxremat.string_backend_reports())
    compiled = torch.compile(model, backend="fxremat", options={"strict": True, "fallback_random": True})
    y = compiled(torch.randn(8, 32))
    y.sum().backward()
    implied = (y.detach() / model.w.detach()).sum(0)
    assert close_scaled(model.w.grad, implied, 1e-5) is None
    (report,) = fxremat.string_backend_reports()[before:]
    assert "aten.native_dropout" not in {r.op for r in report.recomputed}
    conflicts = dict(report.tag_conflicts)
    assert "MUST_RECOMPUTE" in conflicts.get("native_dropout", "") and "random" in conflicts["native_dropout"]
