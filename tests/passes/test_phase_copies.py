"""Per-phase copies of expanding gathers (``passes/graph/phase_copies.py``): Mixtral's batched_mm experts pattern."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_grads_close, capture_joint, eager_grads, run_fxremat_aot

from fxremat_passes.graph.phase_copies import COPY_OF, copy_gathers_per_phase

aten = torch.ops.aten


class BatchedExperts(torch.nn.Module):
    """transformers' ``batched_mm_experts_forward`` in small: every token gathers its expert's weights (tokens x
    ffn x dim from experts x ffn x dim) and multiplies them with its hidden state in a one-row bmm."""

    def __init__(self, experts: int = 4, dim: int = 32, ffn: int = 64) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(experts, 2 * ffn, dim) / dim**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, dim, ffn) / ffn**0.5)
        self.norm = torch.nn.LayerNorm(dim)  # so that the hidden states need a gradient, as in a model

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        gate, up = torch.bmm(self.up[ids], x.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        hidden = torch.nn.functional.silu(gate) * up
        return torch.bmm(self.down[ids], hidden.unsqueeze(-1)).squeeze(-1) + x


def _model_and_inputs(tokens: int = 96):
    torch.manual_seed(0)
    model = BatchedExperts()
    return model, (torch.randn(tokens, 32), torch.randint(0, 4, (tokens,)))


def test_the_backward_readers_get_their_own_copy():
    model, inputs = _model_and_inputs()
    joint, kwargs = capture_joint(model, inputs)
    gathers = [n for n in joint.graph.nodes if n.target is aten.index.Tensor]
    copies = copy_gathers_per_phase(joint, kwargs["num_fwd_outputs"])
    assert len(copies) == len(gathers) == 2
    for twin in copies:
        original = next(n for n in gathers if n.name == twin.meta[COPY_OF])
        assert twin.args == original.args
        assert all(u.target is aten.bmm.default for u in original.users), original.users
    joint.graph.lint()


@pytest.mark.parametrize("budget", [0.5, 0.2, 0.0])
def test_a_lower_budget_never_stores_a_gather_for_two_readers(budget):
    """Before the copies, memory_budget 0.5 recomputed the forward bmms in backward, where the input gradient's bmm
    read the same gather: Inductor stores it (the simulator's realize rule), and the step's simulated peak rose
    from 4.6 MB to 38 MB on a tiny Mixtral (8x here)."""
    model, inputs = _model_and_inputs()
    _, grads_default, _, (default,) = run_fxremat_aot(model, inputs, compare_default=False)
    _, grads, _, (report,) = run_fxremat_aot(model, inputs, memory_budget=budget, compare_default=False)
    assert_grads_close(grads, eager_grads(model, inputs)[1])
    assert report.saved_bytes <= default.saved_bytes
    assert report.simulated_peak_bytes <= 1.10 * default.simulated_peak_bytes, (
        report.simulated_peak_bytes,
        default.simulated_peak_bytes,
    )
    assert not report.peak_raised_by_budget or report.peak_raised_by_budget <= 0.10 * default.simulated_peak_bytes


def test_the_copy_counts_as_a_recomputation():
    model, inputs = _model_and_inputs()
    _, _, _, (report,) = run_fxremat_aot(model, inputs, compare_default=False)
    recomputed = {r.name: r for r in report.recomputed}
    gathers = [r for r in recomputed.values() if "index" in r.op and "put" not in r.op]
    assert len(gathers) == 2, [(r.name, r.op) for r in recomputed.values()]


@pytest.mark.inductor
def test_batched_experts_budget_plans_keep_the_measured_peak_under_inductor():
    """Under real Inductor, with the model's gathers 16x the step's size if stored: every budget plan's gradients
    equal eager's and none measures more than 1.10x the default plan's peak (measured 1.06x; before the per-phase
    copies, a budget plan stored the gathered weights).  The simulation is not asserted here: it is 13-18% low on
    this toy at every setting, a gap not yet explained (benchmarks/RESULTS.md, session 8)."""
    from test_liveness import _measured_step_peak

    import fxremat

    measured = {}
    for options in (dict(), dict(memory_budget=0.5), dict(memory_budget=0.0)):
        model, inputs = _model_and_inputs(tokens=512)
        expected = eager_grads(model, inputs)[1]
        backend = fxremat.backend(compare_default=False, **options)
        peak = _measured_step_peak(model, inputs, backend)
        # the measured step ran last, from gradients set to None: its gradients are one step's
        assert_grads_close({n: p.grad for n, p in model.named_parameters()}, expected)
        measured[str(options)] = peak
    assert max(measured.values()) <= 1.10 * measured["{}"], measured
