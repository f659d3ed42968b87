"""Mutation and aliasing through aot_module with fxremat's partitioner (no-op compilers), against eager: in-place ops
on activations and on inputs, BatchNorm running stats, views returned as outputs, outputs aliasing inputs or
parameters.  Every case checks outputs, parameter and input gradients, buffers and inputs after the step, and that
the report's saved bytes are what autograd keeps.

Reads of a mutated input (a recompute that would read the new value) were a bug, fixed: test_regressions.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fuzz_models import fresh, loss_of
from robust_helpers import FP32_RTOL, assert_steps_match, eager_step, fxremat_step

CONFIGS = {
    "budget None": dict(memory_budget=None),
    "budget 0.0": dict(memory_budget=0.0),
    "price 0": dict(memory_price=0.0),
    "price 1e6": dict(memory_price=1e6),
}


class InplaceOnActivations(nn.Module):
    """mul_, add_ on a slice (autograd's CopySlices), relu_, sigmoid_: every in-place flavour on intermediates."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.gate = nn.Linear(6, 8), nn.Linear(8, 6), nn.Linear(6, 6)

    def forward(self, x, aux):
        h = self.fc1(x)
        h.mul_(2.0)
        h[:, :3].add_(1.0)
        h.relu_()
        g = self.gate(x).sigmoid_()
        return self.fc2(h) * g


class MutatedInputNotRead(nn.Module):
    """aux.add_(1) and aux[:, 0].mul_(3) (through a view): the caller must see both, and nothing reads aux."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, aux):
        aux.add_(1.0)
        aux[:, 0].mul_(3.0)
        return torch.tanh(self.fc(x))


class BatchNormStats(nn.Module):
    """Running mean/var and num_batches_tracked are buffers mutated in forward; a conv + BatchNorm2d path too."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 6), nn.BatchNorm1d(6)
        self.conv, self.bn2 = nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x, aux):
        y = torch.tanh(self.bn(self.fc(x)))
        z = F.gelu(self.bn2(self.conv(x.view(x.shape[0], 1, 2, 3))))
        return y, z


class ViewsAsOutputs(nn.Module):
    """One storage, four outputs: itself, a view, a transpose and a slice (gradients add up in the base)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)

    def forward(self, x, aux):
        h = torch.tanh(self.fc(x))
        return h, h.view(-1), h.t(), h[:, 2:5]


class MutatedViewOutput(nn.Module):
    """A slice of an intermediate, mutated in place after it was taken, returned next to its base."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)

    def forward(self, x, aux):
        h = self.fc(x)
        v = h[:, :4]
        v.mul_(2.0)
        return h.sin(), v


class OutputsAliasInputs(nn.Module):
    """The input itself, views of it, and a parameter's transpose returned as outputs, next to a computed one."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, aux):
        return x, x.view(-1), x[0], self.fc.weight.t(), torch.tanh(self.fc(x)), aux.view(2, -1)


MODELS = [
    InplaceOnActivations,
    MutatedInputNotRead,
    BatchNormStats,
    ViewsAsOutputs,
    MutatedViewOutput,
    OutputsAliasInputs,
]


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 6, generator=generator).requires_grad_(), torch.randn(4, 6, generator=generator)


@pytest.mark.parametrize("label", CONFIGS)
@pytest.mark.parametrize("module", MODELS, ids=lambda m: m.__name__)
def test_matches_eager(module, label):
    torch.manual_seed(0)
    model, inputs = module(), _inputs()
    expected = eager_step(model, fresh(inputs), loss_of)
    actual = fxremat_step(model, fresh(inputs), loss_of, strict=True, compare_default=False, **CONFIGS[label])
    assert_steps_match(actual, expected, FP32_RTOL, f"{module.__name__} {label}")
    (report,) = actual.reports
    assert report.saved_bytes == actual.saved.nbytes


def test_batchnorm_running_stats_moved():
    """The buffer comparison above is not vacuous: one step changes every running stat."""
    model, inputs = BatchNormStats(), _inputs()
    after = fxremat_step(model, fresh(inputs), loss_of, strict=True).buffers
    before = dict(model.named_buffers())
    for name, value in before.items():
        assert not torch.equal(after[name], value), name


def test_mutated_input_is_seen_by_the_caller():
    model, inputs = MutatedInputNotRead(), _inputs()
    result = fxremat_step(model, fresh(inputs), loss_of, strict=True)
    expected = inputs[1] + 1.0
    expected[:, 0] *= 3.0
    torch.testing.assert_close(result.inputs_after[1], expected)
