"""``verify=True`` (fxremat/verify.py) through Dynamo and AOTAutograd with no-op compilers (seconds, no Inductor):
a right plan passes and leaves the step as it was (gradients once, BatchNorm's running statistics updated once, the
same random draws), a wrong plan raises naming the graph and what differs, random graphs are skipped with one
warning.  The backend's wrapping (Inductor, warm cache): tests/e2e/test_verify_inductor.py."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from helpers import assert_grads_close, noop_compiler

import fxremat
from fxremat.examples import example
from fxremat.measure import max_relative_error
from fxremat.options import Options
from fxremat.verify import FxrematVerifyError, FxrematVerifyWarning, Verifier, relative_error, tolerance
from fxremat_passes import _torch_private as tp


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def verified_backend(verifier: Verifier, compile_graph=None, name: str = "test graph", verify: bool = True):
    """A Dynamo backend: fxremat's partition and no-op compilers as Inductor would run them (or
    ``compile_graph``), wrapped by ``verifier`` as ``fxremat.backend(verify=True)`` wraps Inductor."""
    if compile_graph is None:
        partition_fn = fxremat.make_partition_fn(Options.create(strict=True, compare_default=False), [])
        compile_graph = tp.aot_autograd_as_inductor(partition_fn, noop_compiler)

    def backend(gm, example_inputs):
        reference = tp.copy_graph_module(gm)
        compiled = compile_graph(gm, example_inputs)
        return verifier.wrap(compiled, reference, name) if verify else compiled

    return backend


def one_step(model, inputs, backend):
    out = torch.compile(model, backend=backend)(*inputs)
    out.sum().backward()
    return out


def test_right_plan_passes_and_the_step_is_unchanged():
    """BatchNorm: running statistics updated once (the check's compiled run is undone), gradients not doubled."""
    model, inputs = example("convnet")
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FxrematVerifyWarning)
        out = one_step(model, inputs, verified_backend(Verifier()))
    expected = eager(*inputs)
    expected.sum().backward()
    assert max_relative_error(out, expected) < 1e-5
    assert_grads_close(
        {n: p.grad for n, p in model.named_parameters()}, {n: p.grad for n, p in eager.named_parameters()}
    )
    for (name, buffer), expected_buffer in zip(model.named_buffers(), eager.buffers(), strict=True):
        assert torch.allclose(buffer.float(), expected_buffer.float(), rtol=1e-5, atol=1e-7), name
    assert model.bn1.num_batches_tracked.item() == 1


def test_wrong_plan_raises_naming_the_graph_and_the_gradient(broken_plans):
    model, inputs = example("convnet")
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    with pytest.raises(FxrematVerifyError) as info:
        one_step(model, inputs, verified_backend(Verifier(), name="the convnet's graph"))
    message = str(info.value)
    assert broken_plans.swapped, "the broken partition never ran"
    assert message.startswith("fxremat verify: the convnet's graph computes wrong values: the gradient w.r.t. l_")
    assert "max |compiled - eager| / max |eager| = " in message and "backend='inductor'" in message
    # the step did not happen: no gradients, and the check put the running statistics back
    assert all(p.grad is None for p in model.parameters())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name


def test_wrong_forward_output_is_named():
    model, inputs = example("mlp")

    def off_by_one(gm, example_inputs):
        return lambda *args: [out + 1 for out in gm(*args)]

    with pytest.raises(FxrematVerifyError, match=r"output 0 \(\w+\) differs from eager"):
        torch.compile(model, backend=verified_backend(Verifier(), off_by_one))(*inputs)


def test_checked_once_and_under_no_grad_outputs_only():
    model, inputs = example("mlp")
    calls = []

    def counting(gm, example_inputs):
        def run(*args):
            calls.append(torch.is_grad_enabled())
            return gm(*args)

        return run

    compiled = torch.compile(model, backend=verified_backend(Verifier(), counting))
    with torch.no_grad():
        first = compiled(*inputs)
        compiled(*inputs)
    assert len(calls) == 3  # the check's run, the real first call, the second call unchecked
    assert max_relative_error(first, model(*inputs)) < 1e-6


def test_random_graphs_are_skipped_with_one_warning_and_draw_as_without_verify():
    model, inputs = example("dropout")
    other = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5))
    verifier = Verifier()
    torch.manual_seed(1)
    with pytest.warns(FxrematVerifyWarning, match="draws random numbers") as record:
        out = one_step(model, inputs, verified_backend(verifier))
        one_step(other, inputs, verified_backend(verifier))
    assert len([w for w in record if issubclass(w.category, FxrematVerifyWarning)]) == 1
    torch._dynamo.reset()
    torch.manual_seed(1)
    unverified = one_step(copy.deepcopy(model), inputs, verified_backend(Verifier(), name=None, verify=False))
    assert torch.equal(out, unverified)  # the same mask: the check restored the RNG state


def test_relative_error_scales_to_the_reference():
    expected = torch.tensor([1.0, 1e-8, float("nan"), float("inf")])
    assert relative_error(torch.tensor([1.0, 3e-8, float("nan"), float("inf")]), expected) < 1e-6
    assert relative_error(torch.tensor([1.0, 0.0, 0.0, float("inf")]), expected) == float("inf")  # NaN lost
    assert relative_error(torch.tensor([0.5, 0.0, float("nan"), float("inf")]), expected) == pytest.approx(0.5)
    assert relative_error(None, torch.zeros(3)) == 0.0
    assert relative_error(torch.zeros(2), torch.zeros(3)) == float("inf")


def test_tolerance_follows_the_graph_precision():
    gm = torch.fx.symbolic_trace(nn.Linear(4, 4))
    assert tolerance(gm, [torch.zeros(1)]) == 1e-3
    assert tolerance(gm, [torch.zeros(1, dtype=torch.bfloat16)]) == pytest.approx(8 * 2**-7)
