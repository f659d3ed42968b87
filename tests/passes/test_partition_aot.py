"""fxremat's partition through AOTAutograd with no-op compilers: correct gradients, honest byte counts, safety
rules and the fallback path, in milliseconds per case (no Inductor)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn as nn
from helpers import assert_grads_close, capture_joint, eager_grads, noop_compiler, run_aot, run_fxremat_aot

import fxremat
from fxremat import partition as partition_module
from fxremat.examples import EXAMPLES, example
from fxremat.options import Options
from fxremat.report import PEAK_FIELDS, STEP_FIELDS, Recomputation
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.ops import OpClass, op_class
from fxremat_passes.graph.roles import Role, classify

DETERMINISTIC = [n for n in EXAMPLES if n != "dropout"]


@pytest.mark.parametrize("name", DETERMINISTIC)
@pytest.mark.parametrize("price", [0.0, 10.0, 1000.0])
def test_gradients_match_eager(name, price):
    model, inputs = example(name)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=price, strict=True)
    assert_grads_close(grads, expected)
    assert len(reports) == 1 and reports[0].fallback_reason is None


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_report_saved_bytes_equal_saved_tensor_hooks(name):
    """One definition of saved bytes: the report's figure is what autograd actually keeps (measured apart)."""
    model, inputs = example(name)
    _, _, saved, reports = run_fxremat_aot(model, inputs, strict=True)
    assert reports[0].saved_bytes == saved.nbytes


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_baseline_is_pytorchs_default_partition(name):
    """baseline_saved_bytes is what PyTorch's default partitioner keeps, measured on its own run."""
    model, inputs = example(name)
    _, _, reports = None, None, None
    _, _, _, reports = run_fxremat_aot(model, inputs, strict=True, compare_default=True)
    _, _, saved_default = run_aot(model, inputs, tp.min_cut_rematerialization_partition)
    assert reports[0].baseline_saved_bytes == saved_default.nbytes
    assert reports[0].saved_bytes <= reports[0].baseline_saved_bytes


def test_transformer_block_saves_less_than_default():
    model, inputs = example("block_sdpa")
    _, _, _, reports = run_fxremat_aot(model, inputs, strict=True, compare_default=True)
    assert reports[0].saved_bytes < reports[0].baseline_saved_bytes


def test_memory_price_trades_bytes_for_recompute():
    model, inputs = example("block_softmax")
    low = run_fxremat_aot(model, inputs, memory_price=0.0, strict=True)[3][0]
    high = run_fxremat_aot(model, inputs, memory_price=1000.0, strict=True)[3][0]
    assert high.saved_bytes < low.saved_bytes
    assert high.recompute_flops > low.recompute_flops


def test_compare_default_off_skips_baseline():
    model, inputs = example("mlp")
    reports = run_fxremat_aot(model, inputs, compare_default=False, strict=True)[3]
    assert reports[0].baseline_saved_bytes is None


def test_the_default_runs_nothing_for_the_report(monkeypatch):
    """compare_default is off by default (issue 16): no PyTorch partition, no frontier, no simulation during the
    partition; the report says it was not compared instead of showing zeros."""
    monkeypatch.delenv("FXREMAT_COMPARE", raising=False)
    monkeypatch.delenv("FXREMAT_REPORT_DIR", raising=False)
    calls = []
    real = tp.pytorch_default_partition
    monkeypatch.setattr(tp, "pytorch_default_partition", lambda *a, **k: calls.append(1) or real(*a, **k))
    model, inputs = example("block_sdpa")
    report = run_fxremat_aot(model, inputs, strict=True)[3][0]
    assert calls == [] and report.baseline_saved_bytes is None and report.frontier == ()
    assert set(report.pending_fields()) == {*PEAK_FIELDS, *STEP_FIELDS}  # nothing simulated or priced yet
    text = fxremat.format_text(report)
    assert "PyTorch default partition: not compared (compare_default=False)" in text
    assert "PyTorch default" not in text.splitlines()[1]  # the summary's header: fxremat's column alone


# --- randomness -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("price", [0.0, 10.0, 1e6])
def test_dropout_never_redrawn(price):
    """y = dropout(x * w): with a sum loss, grad_w = sum(y / w) over the batch, whatever mask forward drew."""
    model, (x,) = example("dropout")
    reports: list = []
    pf = fxremat.make_partition_fn(Options.create(memory_price=price, strict=True), reports)
    out, grads, _ = run_aot(model, (x,), pf)
    implied = (out.detach() / model.w.detach()).sum(0)
    torch.testing.assert_close(grads["w"], implied, rtol=1e-5, atol=1e-6)
    assert any("random" in reason for reason, _ in reports[0].never_recomputed)


def test_sdpa_is_random_only_with_dropout():
    """CPU SDPA carries the random tag because of dropout_p: with dropout_p=0 it is ordinary attention."""
    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    plain = graph.call_function(sdpa, (q, k, v, 0.0))
    dropping = graph.call_function(sdpa, (q, k, v, 0.3))
    dropping_kw = graph.call_function(sdpa, (q, k, v), {"dropout_p": 0.1})
    assert op_class(plain) is OpClass.ATTENTION
    assert op_class(dropping) is OpClass.RANDOM
    assert op_class(dropping_kw) is OpClass.RANDOM
    assert op_class(graph.call_function(torch.ops.aten.native_dropout.default, (q, 0.5, True))) is OpClass.RANDOM


# --- roles -----------------------------------------------------------------------------------------------------


def test_roles_of_a_joint_graph():
    model, inputs = example("mlp")
    joint, kwargs = capture_joint(model, inputs)
    roles = classify(joint, num_fwd_outputs=kwargs["num_fwd_outputs"], static_lifetime_input_indices=[])
    by_name = {n.name: r for n, r in roles.role.items()}
    assert all(r is Role.INPUT for name, r in by_name.items() if name.startswith("primals"))
    assert all(r is Role.TANGENT for name, r in by_name.items() if name.startswith("tangents"))
    assert any(r is Role.BACKWARD for r in by_name.values())
    assert any(r is Role.FORWARD for r in by_name.values())
    # backward reads the input activations and weights: they are needed
    assert any(n.name.startswith("primals") for n in roles.needed)
    assert all(roles.role[n] not in (Role.BACKWARD, Role.TANGENT) for n in roles.needed)


# --- SAC tags --------------------------------------------------------------------------------------------------


class Tagged(nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)
        self.policy = policy

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        def body(x):
            return self.fc2(torch.sin(self.fc1(x)))

        def policy_fn(ctx, op, *args, **kwargs):
            return self.policy

        return checkpoint(
            body, x, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(policy_fn)
        )


def test_must_save_is_never_recomputed_even_when_memory_is_expensive():
    model, inputs = Tagged(tp.CheckpointPolicy.MUST_SAVE), (torch.randn(8, 32),)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=1e6, strict=True)
    assert_grads_close(grads, expected)
    recomputed_ops = {r.op for r in reports[0].recomputed}
    assert not recomputed_ops & {"aten.mm", "aten.addmm", "aten.sin"}, recomputed_ops


def test_must_recompute_is_never_saved_even_when_memory_is_free():
    model, inputs = Tagged(tp.CheckpointPolicy.MUST_RECOMPUTE), (torch.randn(8, 32),)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=0.0, strict=True)
    assert_grads_close(grads, expected)
    assert reports[0].saved_bytes == 0
    assert {"aten.addmm", "aten.sin"} <= {r.op for r in reports[0].recomputed}


# --- fallback ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pass_name", partition_module.PASSES)
def test_fault_in_any_pass_falls_back_with_one_warning(pass_name):
    model, inputs = example("block_sdpa")
    _, expected = eager_grads(model, inputs)
    with partition_module.inject_fault(pass_name), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, grads, saved, reports = run_fxremat_aot(model, inputs, compare_default=True)
    ours = [w for w in caught if issubclass(w.category, fxremat.FxrematFallbackWarning)]
    assert len(ours) == 1 and pass_name in str(ours[0].message)
    assert_grads_close(grads, expected)
    assert reports[0].fallback_reason and pass_name in reports[0].fallback_reason
    assert reports[0].saved_bytes == reports[0].baseline_saved_bytes == saved.nbytes


def test_a_report_field_made_twice_falls_back_instead_of_failing_the_compile(monkeypatch):
    """Report fields come from several stages' records; a field two records both carry is our bug, caught inside
    the fallback (it used to raise TypeError from the report's constructor, after it, failing the compile)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Twice(Recomputation):  # a stage's record that also carries the compile's graph_id
        graph_id: str = "twice"

    real = partition_module._plan_fields
    monkeypatch.setattr(partition_module, "_plan_fields", lambda *a: Twice(**vars(real(*a))))
    model, inputs = example("mlp")
    _, expected = eager_grads(model, inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, grads, _, reports = run_fxremat_aot(model, inputs)
    assert len([w for w in caught if issubclass(w.category, fxremat.FxrematFallbackWarning)]) == 1
    assert "made twice: ['graph_id']" in reports[0].fallback_reason
    assert reports[0].graph_id != "twice"
    assert_grads_close(grads, expected)


def test_strict_raises_instead_of_falling_back():
    model, inputs = example("mlp")
    with partition_module.inject_fault("solve_min_cut"), pytest.raises(RuntimeError, match="injected fault"):
        run_fxremat_aot(model, inputs, strict=True)


def test_fallback_ignores_a_users_global_memory_budget():
    """The fallback and the baseline use PyTorch's own defaults, not a budget the user set for PyTorch."""
    model, inputs = example("block_sdpa")
    with torch._functorch.config.patch(activation_memory_budget=0.1):
        reports = run_fxremat_aot(model, inputs, strict=True, compare_default=True)[3]
    default_reports = run_fxremat_aot(model, inputs, strict=True, compare_default=True)[3]
    assert reports[0].baseline_saved_bytes == default_reports[0].baseline_saved_bytes


def test_inference_graph_needs_no_partition():
    """Under no_grad AOTAutograd traces a forward only: fxremat's partitioner is never called, so no report."""
    from functorch.compile import aot_module

    model, inputs = example("mlp")
    with torch.no_grad():
        reports: list = []
        calls: list = []
        partition_fn = fxremat.make_partition_fn(Options.create(strict=True), reports)

        def counted(*args, **kwargs):
            calls.append(args)
            return partition_fn(*args, **kwargs)

        compiled = aot_module(model, fw_compiler=noop_compiler, partition_fn=counted)
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    assert calls == [] and reports == []


@pytest.mark.parametrize("checkpoints", ["honour", "replan"])
def test_prefer_tags_bias_the_cut_but_do_not_force_it(checkpoints):
    """PREFER_SAVE is a bias (a recompute cost x 10) in both modes; PREFER_RECOMPUTE is one under
    ``checkpoints="replan"`` and the user's plan under "honour" (tests/passes/test_checkpoint_contract.py)."""
    inputs = (torch.randn(8, 32),)
    plans = {}
    for policy in (tp.CheckpointPolicy.PREFER_RECOMPUTE, tp.CheckpointPolicy.PREFER_SAVE):
        for price in (0.5, 1e6):
            model = Tagged(policy)
            _, expected = eager_grads(model, inputs)
            _, grads, _, reports = run_fxremat_aot(
                model, inputs, memory_price=price, strict=True, checkpoints=checkpoints
            )
            assert_grads_close(grads, expected)
            plans[policy, price] = reports[0]
    prefer_recompute = plans[tp.CheckpointPolicy.PREFER_RECOMPUTE, 0.5]
    prefer_save = plans[tp.CheckpointPolicy.PREFER_SAVE, 0.5]
    assert prefer_recompute.recompute_flops > prefer_save.recompute_flops
    assert prefer_recompute.saved_bytes < prefer_save.saved_bytes
    # a bias, not a rule: when memory is priced high enough, PREFER_SAVE values are recomputed anyway
    assert plans[tp.CheckpointPolicy.PREFER_SAVE, 1e6].saved_bytes < prefer_save.saved_bytes
    # only honour holds the PREFER_RECOMPUTE region to the user's plan (and says so)
    assert (prefer_recompute.user_plan_saved_bytes is not None) == (checkpoints == "honour")
    assert prefer_save.user_plan_saved_bytes is None


def test_prefer_cpu_offload_is_weighed_as_prefer_save():
    """PREFER_CPU_OFFLOAD: the value is kept on the device, with PREFER_SAVE's bias (docs/DESIGN.md §16), not
    passed over as untagged (whose plan at this price saves less)."""
    inputs = (torch.randn(8, 32),)
    reports = {}
    for policy in (tp.CheckpointPolicy.PREFER_SAVE, tp.CheckpointPolicy.PREFER_CPU_OFFLOAD):
        model = Tagged(policy)
        _, expected = eager_grads(model, inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CPU-offload tag's warning (tests/passes/test_torch_knobs.py)
            _, grads, _, found = run_fxremat_aot(model, inputs, memory_price=0.5, strict=True, checkpoints="replan")
        assert_grads_close(grads, expected)
        reports[policy] = found[0]
    save, offload = reports[tp.CheckpointPolicy.PREFER_SAVE], reports[tp.CheckpointPolicy.PREFER_CPU_OFFLOAD]
    assert (offload.saved_bytes, offload.recompute_flops) == (save.saved_bytes, save.recompute_flops)


class AddBias(nn.Module):
    """Backward needs nothing from forward (grad_w = sum of the tangent): the plain split."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return x + self.w


def test_graph_whose_backward_needs_nothing_uses_the_plain_split():
    model, inputs = AddBias(), (torch.randn(4, 16),)
    _, expected = eager_grads(model, inputs)
    _, grads, saved, reports = run_fxremat_aot(model, inputs, strict=True)
    assert_grads_close(grads, expected)
    assert reports[0].fallback_reason is None
    assert reports[0].saved_bytes == saved.nbytes == 0


class MutatesItsBuffer(nn.Module):
    """Forward reads a buffer, then bumps it in place: backward must see the value forward used."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))
        self.register_buffer("scale", torch.full((16,), 2.0))

    def forward(self, x):
        y = torch.sin(x * self.scale) * self.w
        self.scale.add_(1.0)
        return y


@pytest.mark.parametrize("price", [0.0, 1e6])
def test_values_read_from_a_mutated_input_are_never_recomputed(price):
    model, inputs = MutatesItsBuffer(), (torch.randn(4, 16),)
    _, expected = eager_grads(model, inputs)
    _, grads, _, reports = run_fxremat_aot(model, inputs, memory_price=price, strict=True)
    assert_grads_close(grads, expected)
    assert any("mutates in place" in reason for reason, _ in reports[0].never_recomputed)


def test_compare_budgets_adds_pytorchs_budget_points():
    model, inputs = example("block_sdpa")
    report = run_fxremat_aot(model, inputs, compare_budgets=True, strict=True)[3][0]
    budgets = [b for b, _, _ in report.baseline_budget_points]
    assert budgets == [0.5, 0.1, 0.0]
    saved = [s for _, s, _ in report.baseline_budget_points]
    assert saved[0] <= report.baseline_saved_bytes and saved == sorted(saved, reverse=True)
