"""The fast passes against PyTorch's own: ``cse.prepare_joint_graph`` (one-pass dead code elimination + CSE) and
``split.split_with_recipe`` (forward/backward extraction) must give, on every graph fxremat partitions here, the
graphs PyTorch's chain gives (``tp.prepare_joint_graph``; ``tp.split_with_saved_values`` for the same saved set):
the same generated code (so the same placeholders, outputs, order and names), the same ``node.meta`` node for
node, the same output descriptors.  Each test runs real partitions (example models, fuzzer programs, dynamic
shapes, mutated inputs, dropout, multiple outputs) with both computed and compared at every call, then checks
gradients as the other tests do."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn as nn
from fuzz_models import FuzzModel, Program, fresh, loss_of, make_inputs, programs
from hypothesis import HealthCheck, assume, given, settings
from robust_helpers import BF16_RTOL, FP32_RTOL, assert_steps_match, eager_step, fxremat_step

from fxremat import FxrematBudgetWarning
from fxremat import partition as partition_module
from fxremat.examples import EXAMPLES, example
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph import cse
from fxremat_passes.rewrite import split


def _meta_equal(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys(), f"{where}: meta keys differ: {sorted(a.keys() ^ b.keys())}"
    for key in a:
        assert a[key] is b[key] or a[key] == b[key], f"{where}: meta[{key!r}] differs"


def assert_same_graph(ours: torch.fx.Graph, theirs: torch.fx.Graph, what: str) -> None:
    mine, pytorch = list(ours.nodes), list(theirs.nodes)
    assert [n.name for n in mine] == [n.name for n in pytorch], what
    for x, y in zip(mine, pytorch):
        where = f"{what} {x.name}"
        assert (x.op, x.target, str(x.args), str(x.kwargs), x.type) == (
            y.op,
            y.target,
            str(y.args),
            str(y.kwargs),
            y.type,
        ), where
        _meta_equal(x.meta, y.meta, where)


def assert_same_module(ours: torch.fx.GraphModule, theirs: torch.fx.GraphModule, what: str) -> None:
    assert ours.code == theirs.code, what
    assert_same_graph(ours.graph, theirs.graph, what)


class Checks:
    def __init__(self) -> None:
        self.prepared = 0
        self.split = 0


@contextlib.contextmanager
def compared_with_pytorch():
    """Every prepare and split inside partitions done in this context is also done by PyTorch and compared."""
    checks = Checks()
    real_prepare, real_split = partition_module.prepare_joint_graph, partition_module.split_with_recipe

    def prepare(joint):
        theirs = tp.prepare_joint_graph(tp.copy_graph_module(joint))
        ours = real_prepare(joint)
        if cse.subgraph_node(joint.graph) is None:
            assert ours is joint, "prepare copied the joint graph"
        assert_same_graph(ours.graph, theirs.graph, "prepared joint")
        checks.prepared += 1
        return ours

    def split_both(joint, saved_values, saved_sym_nodes, *, num_fwd_outputs, static_lifetime_input_nodes):
        theirs = tp.split_with_saved_values(
            joint,
            list(saved_values),
            list(saved_sym_nodes),
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=static_lifetime_input_nodes,
        )
        *ours, recipe = real_split(
            joint,
            saved_values,
            saved_sym_nodes,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=static_lifetime_input_nodes,
        )
        assert recipe is not None, "our split fell back to PyTorch's extraction"
        # the recipe builds the same pair again (the report's deferred simulation reads that second pair)
        for o, t, name in zip([*ours, *recipe.build(lazy=True)], [*theirs, *theirs], ("forward", "backward") * 2):
            assert_same_module(o, t, name)
            assert o.graph.output_node().meta["desc"] == t.graph.output_node().meta["desc"], name
        # forward's placeholders share the joint graph's meta dicts, as PyTorch's do
        joint_meta = {n.name: n.meta for n in joint.graph.nodes}
        for o, t in ((ours[0], theirs[0]), (ours[1], theirs[1])):
            for x, y in zip(o.graph.find_nodes(op="placeholder"), t.graph.find_nodes(op="placeholder")):
                assert (x.meta is joint_meta[x.name]) == (y.meta is joint_meta[y.name]), x.name
        checks.split += 1
        return (*ours, recipe)

    partition_module.prepare_joint_graph = prepare
    partition_module.split_with_recipe = split_both
    try:
        yield checks
    finally:
        partition_module.prepare_joint_graph = real_prepare
        partition_module.split_with_recipe = real_split


CONFIGS = {
    "default": dict(),
    "budget 0.5": dict(memory_budget=0.5),
    "budget 0.0": dict(memory_budget=0.0),
    "price 0": dict(memory_price=0.0),
}


def _step_checked(model, inputs, loss, config, require_partition: bool = True) -> object:
    with compared_with_pytorch() as checks, warnings.catch_warnings():
        warnings.simplefilter("ignore", FxrematBudgetWarning)
        torch.manual_seed(1)
        result = fxremat_step(model, fresh(inputs), loss, strict=True, compare_default=False, **config)
    if require_partition:
        assert result.reports, "no joint graph was partitioned: nothing was compared"
    for report in result.reports:
        assert report.fallback_reason is None
    # every split is compared, and a budget's peak-safe choice splits each plan it simulates
    assert checks.split >= checks.prepared == len(result.reports)
    return result


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_split_like_pytorch(name, config):
    model, inputs = example(name)
    result = _step_checked(model, inputs, lambda out: out.sum(), CONFIGS[config])
    assert len(result.reports) == 1
    if name != "dropout":
        assert_steps_match(result, eager_step(model, fresh(inputs), lambda out: out.sum()), FP32_RTOL, config)


@settings(
    max_examples=20,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs())
def test_fuzzed_programs_split_like_pytorch(program: Program):
    """Random modules: multiple outputs, mutated inputs, views, splits, dropout, bf16, an unused input."""
    torch.manual_seed(0)
    model, inputs = FuzzModel(program), make_inputs(program)
    rtol = BF16_RTOL if program.touches_bf16 else FP32_RTOL
    reference = None if program.has_dropout else eager_step(model, fresh(inputs), loss_of)
    for label in ("default", "budget 0.5"):
        result = _step_checked(model, inputs, loss_of, CONFIGS[label], require_partition=False)
        # a program that only views its input compiles to no joint graph: not a passing comparison, a discarded one
        assume(result.reports)
        if reference is not None:
            assert_steps_match(result, reference, rtol, label)


class Duplicates(nn.Module):
    """Computations CSE must merge (twice the same sin) and must not (dropout twice; the same add either side of an
    in-place update; 1 and 1.0 as constants; an output and its duplicate)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, y):
        a, b = x.sin() * y, x.sin() * y
        c = torch.nn.functional.dropout(a, 0.5) + torch.nn.functional.dropout(a, 0.5)
        before = (x + 1) * (x + 1.0)
        self.count.add_(1)
        after = (x + 1) * b
        return a + c + before + after, b * 2, b * 2


def test_duplicates_merge_like_pytorch():
    model, x, y = Duplicates(), torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    result = _step_checked(model, (x, y), lambda out: sum(o.sum() for o in out), CONFIGS["budget 0.5"])
    assert len(result.reports) == 1


def test_dynamic_shapes_split_like_pytorch():
    """SymInts saved for backward, and the SymInts binding the saved tensors' symbols added by the split."""
    from helpers import aot_eager
    from test_dynamic_shapes import ReshapeByLength, _loss

    import fxremat
    from fxremat.options import Options

    for config in ("default", "budget 0.5"):
        torch._dynamo.reset()
        reports: list = []
        partition_fn = fxremat.make_partition_fn(Options.create(strict=True, **CONFIGS[config]), reports)
        backend = aot_eager(partition_fn)
        model = ReshapeByLength()
        eager = copy.deepcopy(model)
        compiled = torch.compile(model, backend=backend, dynamic=True)
        with compared_with_pytorch() as checks:
            for length in (5, 9):
                x = torch.randn(3, length, 8)
                _loss(compiled(x)).backward()
                _loss(eager(x)).backward()
        assert checks.split >= len(reports) >= 1  # a budget splits every plan it simulates
        assert any(r.saved_symbols for r in reports)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_unsupported_graph_uses_pytorchs_extraction(monkeypatch):
    """A graph feature the split does not reproduce: PyTorch's chain, same plan, no fallback of the partition."""
    monkeypatch.setattr(split, "unsupported_reason", lambda joint: "pretend")
    calls = []
    pytorch_split = tp.split_with_saved_values
    monkeypatch.setattr(tp, "split_with_saved_values", lambda *a, **k: calls.append(1) or pytorch_split(*a, **k))
    model, inputs = example("mlp")
    ours = fxremat_step(model, fresh(inputs), lambda out: out.sum(), strict=True, compare_default=False)
    assert calls == [1]  # PyTorch's extraction made the split
    assert ours.reports[0].fallback_reason is None
    assert_steps_match(ours, eager_step(model, fresh(inputs), lambda out: out.sum()), FP32_RTOL)


def _meta_of(gm):
    return [(n.name, dict(n.meta)) for n in gm.graph.nodes]


def test_prepare_marks_the_joint_itself_and_the_snapshot_undoes_the_marks():
    from helpers import capture_joint

    model, inputs = example("block_sdpa")
    gm, _ = capture_joint(model, inputs)
    code, before = gm.code, _meta_of(gm)
    snapshot = cse.MetaSnapshot(gm.graph)
    theirs = tp.prepare_joint_graph(tp.copy_graph_module(gm))
    prepared = cse.prepare_joint_graph(gm)
    assert prepared is gm  # nothing dead, nothing merged here; no copy either way
    assert gm.code == code
    assert_same_graph(prepared.graph, theirs.graph, "prepared joint")  # PyTorch's marks, as PyTorch makes them
    assert _meta_of(gm) != before  # the marks are on the joint's own nodes ...
    snapshot.restore()
    assert _meta_of(gm) == before  # ... until the snapshot puts them back


class TwiceTheSame(nn.Module):
    """``x @ w`` and its tanh twice: CSE merges them (and their backward's duplicates)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return (x @ self.w).tanh() + (x @ self.w).tanh()


def test_prepare_merges_duplicates_in_the_joint_itself_as_pytorch_would():
    from helpers import capture_joint

    gm, kwargs = capture_joint(TwiceTheSame(), (torch.randn(4, 8),))
    original = tp.copy_graph_module(gm)
    theirs = tp.prepare_joint_graph(tp.copy_graph_module(gm))
    prepared = cse.prepare_joint_graph(gm)
    assert prepared is gm and len(gm.graph.nodes) < len(original.graph.nodes)  # the duplicates merged
    assert_same_graph(gm.graph, theirs.graph, "prepared joint")
    gm.graph.lint()
    # a fallback gets the cleaned joint: PyTorch partitions it exactly as it partitions the joint as it came
    for a, b in zip(
        tp.pytorch_default_partition(gm, None, **kwargs),
        tp.pytorch_default_partition(original, None, **kwargs),
    ):
        assert a.code == b.code


@pytest.mark.parametrize("fail_in", ["build_flow_problem", "split_with_recipe"])
def test_fallback_gets_the_joint_as_it_came(monkeypatch, fail_in):
    """Our passes fail after marking the joint's own nodes: PyTorch's partitioner still receives it unmarked."""
    model, inputs = example("block_sdpa")
    seen = []
    pytorch_default = tp.pytorch_default_partition

    def spy(joint, *args, **kwargs):
        seen.append(_meta_of(joint))
        return pytorch_default(joint, *args, **kwargs)

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    captured = []
    real_prepare = partition_module.prepare_joint_graph

    def prepare(joint):
        captured.append(_meta_of(joint))
        return real_prepare(joint)

    monkeypatch.setattr(tp, "pytorch_default_partition", spy)
    monkeypatch.setattr(partition_module, fail_in, broken)
    monkeypatch.setattr(partition_module, "prepare_joint_graph", prepare)
    with pytest.warns(Warning, match="injected"):
        ours = fxremat_step(model, fresh(inputs), lambda out: out.sum(), compare_default=False)
    assert ours.reports[0].fallback_reason.endswith("injected")
    assert len(seen) == 1 and seen[0] == captured[0]
    assert_steps_match(ours, eager_step(model, fresh(inputs), lambda out: out.sum()), FP32_RTOL)
