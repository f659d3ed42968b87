"""One training step through aot_module with a chosen partitioner and no-op compilers, or in eager, with everything
a partition can get wrong collected for comparison: outputs, parameter AND input gradients, buffers after the step
(BatchNorm running stats), inputs after the step (mutated inputs), and what autograd saved.

A module of its own rather than tests/robustness/conftest.py: under pytest's default import mode every directory's
conftest.py is imported as the one module ``conftest``, so what one holds cannot be imported by name (tests/helpers.py
is a module for the same reason).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from functorch.compile import aot_module
from helpers import noop_compiler

import fxremat
from fxremat.measure import SavedTensors, max_relative_error, measure_saved
from fxremat.options import Options

# The partitioner of PyTorch's default, as Inductor calls it (the reference for models with dropout).
from fxremat_passes._torch_private import min_cut_rematerialization_partition as pytorch_default_partition  # noqa: F401

FP32_RTOL = 1e-4
BF16_RTOL = 2e-2


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclass
class StepResult:
    outputs: tuple[torch.Tensor, ...]
    grads: dict[str, torch.Tensor | None]  # "param <name>" and "input <k>" (None: no gradient reached it)
    buffers: dict[str, torch.Tensor]
    inputs_after: tuple[torch.Tensor, ...]
    saved: SavedTensors | None = None
    reports: list = field(default_factory=list)


def _collect(model, inputs, out, saved=None, reports=None) -> StepResult:
    grads: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        grads[f"param {name}"] = None if p.grad is None else p.grad.detach().clone()
    for k, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            grads[f"input {k}"] = None if t.grad is None else t.grad.detach().clone()
    return StepResult(
        outputs=tuple(o.detach().clone() for o in as_tuple(out)),
        grads=grads,
        buffers={n: b.detach().clone() for n, b in model.named_buffers()},
        inputs_after=tuple(t.detach().clone() for t in inputs),
        saved=saved,
        reports=list(reports or []),
    )


def eager_step(model, inputs, loss: Callable) -> StepResult:
    """One step of ``model`` (a copy is taken: buffers and grads of the caller's model stay untouched)."""
    model = copy.deepcopy(model)
    out = model(*inputs)
    loss(out).backward()
    return _collect(model, inputs, out)


def aot_step(model, inputs, partition_fn, loss: Callable, reports: list | None = None) -> StepResult:
    """One step through aot_module with ``partition_fn`` and no-op compilers, on a copy of ``model``."""
    model = copy.deepcopy(model)
    compiled = aot_module(model, fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition_fn)
    exclude = [*model.parameters(), *model.buffers(), *inputs]
    out, saved = measure_saved(lambda: compiled(*inputs), exclude)
    loss(out).backward()
    return _collect(model, inputs, out, saved, reports)


def fxremat_step(model, inputs, loss: Callable, **options) -> StepResult:
    reports: list = []
    partition_fn = fxremat.make_partition_fn(Options.create(**options), reports)
    return aot_step(model, inputs, partition_fn, loss, reports)


def close_scaled(actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> float | None:
    """The error scaled to ``expected``'s magnitude (fxremat.measure.max_relative_error), or None if within rtol.
    Values are compared in fp32 (bf16 outputs included)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf")
    if not expected.is_floating_point():
        return None if torch.equal(actual, expected) else float("inf")
    error = max_relative_error(actual.float(), expected.float())
    return None if error <= rtol else error


def assert_steps_match(actual: StepResult, expected: StepResult, rtol: float, what: str = "") -> None:
    """Outputs, every gradient (parameters and inputs; missing on one side is a failure), buffers and mutated
    inputs, each within ``rtol`` of the reference's own magnitude."""
    bad: dict[str, object] = {}
    if len(actual.outputs) != len(expected.outputs):
        bad["outputs"] = (len(actual.outputs), len(expected.outputs))
    for k, (a, e) in enumerate(zip(actual.outputs, expected.outputs)):
        if (err := close_scaled(a, e, rtol)) is not None:
            bad[f"output {k}"] = err
    if set(actual.grads) != set(expected.grads):
        bad["gradient names"] = (sorted(actual.grads), sorted(expected.grads))
    for name, e in expected.grads.items():
        a = actual.grads.get(name)
        if (a is None) != (e is None):
            bad[name] = f"gradient is {'None' if a is None else 'set'} but {'None' if e is None else 'set'} in eager"
        elif e is not None and (err := close_scaled(a, e, rtol)) is not None:
            bad[name] = err
    for name, e in expected.buffers.items():
        if (err := close_scaled(actual.buffers[name], e, rtol)) is not None:
            bad[f"buffer {name}"] = err
    for k, (a, e) in enumerate(zip(actual.inputs_after, expected.inputs_after)):
        if (err := close_scaled(a, e, rtol)) is not None:
            bad[f"input {k} after the step"] = err
    assert not bad, f"{what}: differs from the reference (relative error > {rtol}): {bad}"


# --- selective activation checkpointing: a policy context, and dropout tagged MUST_RECOMPUTE ----------------------


def _policy(kind, ctx, op, *args, **kwargs):
    return kind


def sac_context(kind):
    """A ``context_fn`` whose policy answers ``kind`` for every op (Dynamo needs a functools.partial, not a lambda)."""
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, kind))


class TaggedDropout(torch.nn.Module):
    """y = dropout(x * w) in a region whose policy says MUST_RECOMPUTE for every op: with a sum loss,
    grad_w = sum(y / w) over the batch for the mask the forward drew; a redrawn mask breaks that."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def _body(self, x):
        return torch.nn.functional.dropout(x * self.w, 0.5, training=True)

    def forward(self, x):
        from torch.utils.checkpoint import CheckpointPolicy, checkpoint

        return checkpoint(self._body, x, use_reentrant=False, context_fn=sac_context(CheckpointPolicy.MUST_RECOMPUTE))
