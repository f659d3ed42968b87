"""``fxremat.backend(verify=True)`` with real Inductor: a right plan passes (a convnet: BatchNorm's running statistics
and Inductor's channels-last layouts, issue #20's ground), a wrong plan raises on its first call, and so does the
same wrong plan served by a warm compile cache, where the partitioner never runs; a graph with dropout is skipped.

Each test has its own Inductor cache: the wrong plan is cached under the right plan's key (a patched partition
leaves fxremat's uuid as it is), and must not reach any other test.  Measured here (2 cores, 1 thread): 28 s, 5 s
and 20 s.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import assert_grads_close

import fxremat
from fxremat.examples import MLP, example
from fxremat.measure import max_relative_error

pytestmark = pytest.mark.inductor


@pytest.fixture
def fresh_inductor_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_right_plan_passes_and_the_step_matches_eager(fresh_inductor_cache):
    torch.manual_seed(0)
    model, inputs = example("convnet")
    eager = copy.deepcopy(model)
    backend = fxremat.backend(verify=True, strict=True, compare_default=False)
    out = torch.compile(model, backend=backend)(*inputs)
    out.sum().backward()
    expected = eager(*inputs)
    expected.sum().backward()
    assert max_relative_error(out, expected) < 1e-4
    # gradients once (the check's backward went through autograd.grad), running statistics updated once
    assert_grads_close(
        {n: p.grad for n, p in model.named_parameters()},
        {n: p.grad for n, p in eager.named_parameters()},
        rtol=1e-3,
    )
    for (name, buffer), expected_buffer in zip(model.named_buffers(), eager.buffers(), strict=True):
        assert max_relative_error(buffer.float(), expected_buffer.float()) < 1e-4, name
    assert backend.reports[0].fallback_reason is None


def test_wrong_plan_raises_cold_and_from_a_warm_cache(fresh_inductor_cache, broken_plans):
    torch.manual_seed(0)
    model, inputs = MLP(32, 32), (torch.randn(64, 32),)  # square weights: saved tensors of equal shape to swap
    backend = fxremat.backend(verify=True, strict=True, compare_default=False)
    with pytest.raises(fxremat.FxrematVerifyError, match=r"Dynamo graph \S+ \(fxremat graph_\d+\) computes wrong"):
        torch.compile(model, backend=backend)(*inputs)
    assert len(broken_plans.swapped) == 1
    assert all(p.grad is None for p in model.parameters())  # the step did not run
    graph_id = backend.reports[0].graph_id

    broken_plans.stop()  # from here on a wrong plan can only come from the cache
    torch._dynamo.reset()
    backend = fxremat.backend(verify=True, strict=True, compare_default=False)
    with pytest.raises(fxremat.FxrematVerifyError, match=rf"\(fxremat {graph_id}\).*the gradient w\.r\.t\. l_"):
        torch.compile(copy.deepcopy(model), backend=backend)(*inputs)
    assert len(broken_plans.swapped) == 1 and backend.reports[0].from_cache  # the partitioner never ran


def test_random_graph_is_skipped_and_draws_as_without_verify(fresh_inductor_cache):
    """Inductor's dropout cannot be compared with eager's: one warning; and the check's own run leaves the RNG as
    it found it, so the step draws the mask an unverified compile draws (that one served by the cache)."""
    model, inputs = example("dropout")
    outputs = {}
    for verify in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outputs[verify] = torch.compile(copy.deepcopy(model), backend=fxremat.backend(verify=verify))(*inputs)
        skipped = [w for w in caught if issubclass(w.category, fxremat.FxrematVerifyWarning)]
        assert len(skipped) == int(verify) and (not verify or "draws random numbers" in str(skipped[0].message))
    assert torch.equal(outputs[True], outputs[False])
