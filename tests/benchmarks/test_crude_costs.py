"""benchmarks/crude_costs.py's variants cut differently where the weights matter (aot_module, no-op compilers)."""

from __future__ import annotations

import torch
from crude_costs import costs_variant
from helpers import run_fxremat_aot


class TanhErfChain(torch.nn.Module):
    """fc2(erf(tanh(tanh(fc1(x))))): backward needs every value of the chain, which is either saved or recomputed
    from fc1's output inside one fused kernel."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, dim)
        self.fc2 = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc2(torch.erf(torch.tanh(torch.tanh(self.fc1(x)))))


def _cut(variant: str):
    real: dict = {}
    with costs_variant(variant, real):
        _, _, saved, reports = run_fxremat_aot(TanhErfChain(), (torch.randn(256, 64),), strict=True)
    (report,) = reports
    transcendental = sorted(r.op for r in report.recomputed if r.op in ("aten.tanh", "aten.erf"))
    return report, transcendental, saved


def test_transcendental_chain_is_recomputed_less_once_its_weight_is_real():
    unweighted, recomputed_unweighted, _ = _cut("no_weights")
    weighted, recomputed_weighted, saved = _cut("real")
    assert recomputed_unweighted == ["aten.erf", "aten.tanh", "aten.tanh"]  # 1 FLOP each: cheaper than a save
    # at their measured weights (tanh 30, erf 15) one tanh output is kept instead of the first linear's: the
    # recompute of two tanh from it would cost more than keeping one tanh output
    assert recomputed_weighted == ["aten.erf", "aten.tanh"]
    assert weighted.est_recompute_seconds > unweighted.est_recompute_seconds  # the same work, priced honestly
    assert saved.nbytes == weighted.saved_bytes  # the report's bytes are what autograd keeps
