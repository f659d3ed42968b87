"""The gradient check's rule, on plain numbers: which parameters a compiled step got wrong.

Both the compiled step and eager fp32 are compared with an fp64 eager copy of the model (same weights, same
inputs cast to double): ``error = max|g - g64| / max|g64|`` per parameter.  fp32 itself is not exact, and some
gradients (a long reduction, a near-cancelling sum) carry a real fp32 error, so a parameter is WRONG only when its
error exceeds ``TOLERANCE`` *and* ``EAGER_FACTOR`` times eager fp32's own error on that parameter: a compiled
step may differ from fp64 as much as eager does, plus rounding, never by a new mistake.  The forward loss is
judged the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

TOLERANCE = 1e-3
EAGER_FACTOR = 10.0
# A parameter whose fp64 gradient is below this fraction of the model's largest fp64 gradient has a gradient that
# is zero in exact arithmetic (an attention key bias: softmax ignores a per-row shift); fp32 returns rounding noise
# there, and noise relative to fp64's much smaller noise is a meaningless 1e5.  Such a parameter is measured on the
# model's largest gradient instead (bench_measure.NEAR_ZERO_GRAD does the same against eager fp32).
NEAR_ZERO_GRAD = 1e-6


def is_wrong(error: float, eager_error: float) -> bool:
    """The rule.  Written as "not within either bound" so that a NaN error counts as wrong."""
    return not (error <= TOLERANCE or error <= EAGER_FACTOR * eager_error)


def relative_errors(
    grads: Mapping[str, torch.Tensor | None], reference: Mapping[str, torch.Tensor]
) -> tuple[dict[str, float], list[str]]:
    """(error per parameter of ``reference``, parameters measured on the model's scale because their gradient is ~0).

    A parameter the reference has a gradient for and ``grads`` has none is infinitely wrong."""
    model_scale = max((g.abs().max().item() for g in reference.values()), default=0.0)
    errors, near_zero = {}, []
    for name, expected in reference.items():
        actual = grads.get(name)
        if actual is None:
            errors[name] = math.inf
            continue
        scale = expected.abs().max().item()
        if scale < NEAR_ZERO_GRAD * model_scale:
            near_zero.append(name)
            scale = model_scale
        diff = (actual.detach().double() - expected.detach().double()).abs().max().item()
        errors[name] = diff / scale if scale else diff
    return errors, near_zero


def loss_error(loss: float, reference: float) -> float:
    return abs(loss - reference) / abs(reference) if reference else abs(loss - reference)


def judge(errors: Mapping[str, float], eager_errors: Mapping[str, float]) -> dict[str, Any]:
    """The per-parameter verdict of one compiled step, as plain JSON values.  ``wrong`` lists every wrong
    parameter, worst first, with both errors."""
    wrong = [n for n in errors if is_wrong(errors[n], eager_errors.get(n, 0.0))]
    wrong.sort(key=lambda n: _sort_key(errors[n]), reverse=True)
    worst = max(errors, key=lambda n: _sort_key(errors[n]), default=None)
    eager_worst = max(eager_errors, key=lambda n: _sort_key(eager_errors[n]), default=None)
    return dict(
        params=len(errors),
        wrong_params=len(wrong),
        wrong=[dict(name=n, error=errors[n], eager_error=eager_errors.get(n)) for n in wrong],
        worst_error=None if worst is None else errors[worst],
        worst_param=worst,
        eager_worst_error=None if eager_worst is None else eager_errors[eager_worst],
        eager_worst_param=eager_worst,
    )


def _sort_key(error: float) -> float:
    return math.inf if math.isnan(error) else error  # a NaN is the worst error there is
