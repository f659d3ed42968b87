"""The caller's work between the graphs (passes/simulator/boundary.py): the estimate from the outputs that receive a
gradient, the user's figure, and the boundary point in a simulated step of a model whose loss runs outside it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_grads_close, eager_grads, run_aot, run_fxremat_aot

import fxremat
from fxremat.options import Options
from fxremat_passes.simulator import boundary
from fxremat_passes.simulator.liveness import CALLER_LOSS


def test_no_estimate_where_a_scalar_output_receives_a_gradient():
    logits, loss = torch.empty(4, 10), torch.empty(())
    assert boundary.estimated_caller_bytes([loss, logits]) == 0
    assert boundary.estimated_caller_bytes([]) == 0


def test_estimate_is_two_fp32_copies_of_each_output():
    assert boundary.estimated_caller_bytes([torch.empty(4, 10)]) == 2 * 40 * 4
    assert boundary.estimated_caller_bytes([torch.empty(4, 10, dtype=torch.bfloat16)]) == 2 * 40 * 4  # upcast
    assert boundary.estimated_caller_bytes([torch.empty(4, 10, dtype=torch.float64)]) == 2 * 40 * 8
    assert boundary.estimated_caller_bytes([torch.empty(4, dtype=torch.int64)]) == 0  # no gradient there


def test_the_users_figure_wins():
    assert boundary.caller_bytes(0, [torch.empty(4, 10)]) == 0
    assert boundary.caller_bytes(123, [torch.empty(())]) == 123


class Head(nn.Module):
    def __init__(self, vocab=512, hidden=32):
        super().__init__()
        self.body, self.head = nn.Linear(hidden, hidden), nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


class WithLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return F.cross_entropy(self.model(x), y)


def _report(caller_bytes=None, loss_inside=False):
    """One step through AOTAutograd with fxremat's partitioner; the cross-entropy in the graph or in eager."""
    torch.manual_seed(0)
    model, x, y = Head(), torch.randn(64, 32), torch.randint(0, 512, (64,))
    _, expected = eager_grads(model, (x,), loss=lambda out: F.cross_entropy(out, y))
    options = dict(compare_default=True, caller_bytes=caller_bytes, strict=True)
    if loss_inside:
        _, grads, _, reports = run_fxremat_aot(WithLoss(model), (x, y), **options)
        grads = {k.removeprefix("model."): v for k, v in grads.items()}
    else:
        reports = []
        partition_fn = fxremat.make_partition_fn(Options.create(**options), reports)
        _, grads, _ = run_aot(model, (x,), partition_fn, loss=lambda out: F.cross_entropy(out, y))
    assert_grads_close(grads, expected)
    return reports[-1]


def test_loss_outside_adds_the_boundary_point():
    report = _report()
    logits_bytes = 64 * 512 * 4
    assert report.simulated_caller_bytes == 2 * logits_bytes
    points = [p for p in report.memory_timeline if p[0] == "boundary"]
    assert [p[1] for p in points] == [CALLER_LOSS]
    assert report.simulated_peak_at == f"boundary:{CALLER_LOSS}"  # the logits dominate this step


def test_a_given_zero_removes_it_and_the_loss_inside_needs_none():
    for report in (_report(caller_bytes=0), _report(loss_inside=True)):
        assert report.simulated_caller_bytes == 0
        assert not [p for p in report.memory_timeline if p[0] == "boundary"]


def test_bad_caller_bytes_are_refused():
    with pytest.raises(TypeError, match="caller_bytes"):
        fxremat.backend(caller_bytes=-1)
    assert fxremat.backend(caller_bytes="1MiB").options.caller_bytes == 2**20
