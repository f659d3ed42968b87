"""Dynamic shapes through Dynamo + AOTAutograd (no Inductor), and ops fxremat knows nothing about."""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn as nn
from helpers import aot_eager, assert_grads_close, run_fxremat_aot

import fxremat
from fxremat.examples import example
from fxremat.options import Options


def test_dynamic_shapes_one_partition_serves_every_length_with_symbolic_bytes():
    reports: list = []
    pf = fxremat.make_partition_fn(Options.create(strict=True), reports)
    backend = aot_eager(pf)
    model, _ = example("block_sdpa")
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for length in (32, 48, 20):
        x = torch.randn(4, length, 64)
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
        eager(x).sum().backward()
        assert_grads_close(
            {n: p.grad for n, p in model.named_parameters()}, {n: p.grad for n, p in eager.named_parameters()}
        )
    assert len(reports) == 1  # no recompile (and no new partition) per length
    expressions = [row.nbytes_expr for row in reports[0].saved]
    assert any(any(ch.isalpha() for ch in expr) for expr in expressions), expressions  # e.g. 256*s27*s77


@torch.library.custom_op("fxremat_test::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)


def _scale_backward(ctx, grad):
    return grad * ctx.factor, None


def _scale_setup(ctx, inputs, output):
    ctx.factor = inputs[1]


scale.register_autograd(_scale_backward, setup_context=_scale_setup)


class CustomOpModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.tanh(scale(self.fc1(x), 3.0)))


def test_custom_op_is_never_recomputed_and_logged(caplog):
    model, inputs = CustomOpModel(), (torch.randn(8, 16),)
    eager = copy.deepcopy(model)
    eager(*inputs).sum().backward()
    with caplog.at_level(logging.DEBUG, logger="fxremat_passes"):
        _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=1e6, strict=True)
    assert_grads_close(grads, {n: p.grad for n, p in eager.named_parameters()})
    assert "fxremat_test.scale" not in {r.op for r in reports[0].recomputed}
    assert any("opaque" in reason for reason, _ in reports[0].never_recomputed)
    assert any("no cost model" in r.message and "fxremat_test.scale" in r.message for r in caplog.records)
