"""The torch tiers' shared helpers (tests/passes, e2e, robustness, benchmarks, tools): run a model through
AOTAutograd with a chosen partitioner and no-op compilers (milliseconds, no Inductor), capture joint graphs, and
compare gradients with eager.  Tests import them by name (``from helpers import run_aot``); the fixtures at the end
are registered by each torch tier's own conftest.py, which imports them.

A module rather than a conftest.py: under pytest's default import mode every conftest.py is imported as the one
module ``conftest``, so helpers there could not be imported by name from more than one directory.  Not imported by
tests/conftest.py, so that tests/solver runs where torch is not installed.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from functorch.compile import aot_module, make_boxed_func

import fxremat
from fxremat.measure import measure_saved
from fxremat.options import Options


def noop_compiler(gm, example_inputs):
    """A "compiler" that runs the graph as it is: partition tests take milliseconds, not Inductor's minutes."""
    return make_boxed_func(gm.forward)


def aot_eager(partition_fn):
    """A torch.compile backend: AOTAutograd with ``partition_fn`` and no-op compilers for both graphs."""
    from fxremat_passes import _torch_private as tp

    return tp.aot_autograd(fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition_fn)


def run_aot(model, inputs, partition_fn, loss=lambda out: out.sum()):
    """One training step of ``model`` through aot_module with ``partition_fn``; returns (output, grads, saved)."""
    compiled = aot_module(model, fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition_fn)
    model.zero_grad(set_to_none=True)
    exclude = [*model.parameters(), *model.buffers(), *inputs]
    out, saved = measure_saved(lambda: compiled(*inputs), exclude)
    loss(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, saved


def run_fxremat_aot(model, inputs, **options):
    reports: list = []
    out, grads, saved = run_aot(model, inputs, fxremat.make_partition_fn(Options.create(**options), reports))
    return out, grads, saved, reports


def recording_partition_fn(**settings):
    """(partition_fn, reports, graphs): fxremat's strict partition with ``settings``, each report and each (forward,
    backward) pair it hands on kept, for tests that read the graphs as well as the report."""
    reports: list = []
    graphs: list = []
    inner = fxremat.make_partition_fn(Options.create(strict=True, **settings), reports)

    def partition_fn(joint, joint_inputs, **kwargs):
        fw, bw = inner(joint, joint_inputs, **kwargs)
        graphs.extend((fw, bw))
        return fw, bw

    return partition_fn, reports, graphs


def eager_grads(model, inputs, loss=lambda out: out.sum()):
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss(out).backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def capture_joint(model, inputs):
    """The joint graph AOTAutograd hands a partitioner, plus its kwargs (num_fwd_outputs, ...)."""
    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured["gm"] = copy.deepcopy(gm)
        captured["kwargs"] = kwargs
        from torch._functorch.partitioners import default_partition

        return default_partition(gm, joint_inputs, **kwargs)

    run_aot(model, inputs, partition_fn)
    return captured["gm"], captured["kwargs"]


def assert_grads_close(actual: dict, expected: dict, rtol: float = 1e-4) -> None:
    from fxremat.measure import max_relative_error

    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    errors = {n: max_relative_error(actual[n], expected[n]) for n in expected}
    bad = {n: e for n, e in errors.items() if not e <= rtol}
    assert not bad, f"gradients differ from eager (max relative error > {rtol}): {bad}"


def swap_two_saved(fw, num_fwd_outputs: int) -> tuple[str, str]:
    """A deliberately wrong plan (tests of ``verify``): swap two saved tensors of equal shape and dtype in the
    forward's outputs, so that backward reads each where it expects the other.  Returns their names."""
    output = fw.graph.output_node()
    values = list(output.args[0])
    by_kind: dict = {}
    for i in range(num_fwd_outputs, len(values)):
        val = getattr(values[i], "meta", {}).get("val")
        if isinstance(val, torch.Tensor):
            by_kind.setdefault((tuple(val.shape), val.dtype), []).append(i)
    pair = next((indices for indices in by_kind.values() if len(indices) >= 2), None)
    assert pair is not None, "no two saved tensors of equal shape and dtype to swap: pick another model"
    a, b = pair[:2]
    values[a], values[b] = values[b], values[a]
    output.args = (type(output.args[0])(values), *output.args[1:])
    fw.recompile()
    return values[b].name, values[a].name


class BrokenPlans:
    """While on, every fxremat partition (Inductor's, or ``make_partition_fn``'s) swaps two saved tensors."""

    def __init__(self, monkeypatch) -> None:

        self._module = sys.modules["fxremat.partition"]
        self._real = self._module.partition
        self._monkeypatch = monkeypatch
        self.swapped: list[tuple[str, str]] = []  # the names swapped, per partition
        monkeypatch.setattr(self._module, "partition", self._partition)

    def _partition(self, request, options):
        fw, bw, report = self._real(request, options)
        self.swapped.append(swap_two_saved(fw, request.num_fwd_outputs))
        return fw, bw, report

    def stop(self) -> None:
        """Right plans again (from here on, a wrong plan can only come from a cache)."""
        self._monkeypatch.setattr(self._module, "partition", self._real)


@pytest.fixture
def broken_plans(monkeypatch):
    return BrokenPlans(monkeypatch)


@pytest.fixture(autouse=True)
def torch_seed():
    """Every torch test starts from the same random state (each tier's conftest.py makes it autouse there)."""
    torch.manual_seed(0)


def split_as_compiled(model, x, options: Options, as_inductor: bool, loss=lambda out: out.sum(), joint_passes=False):
    """(forward, backward, report) of one training step of ``model`` on ``x`` as fxremat hands the two graphs to
    the compiler (``as_inductor``: the split Inductor would get), run by no-op compilers; the parameters' ``grad``
    are that step's.  ``joint_passes``: Inductor's own partition function calls fxremat's, so that its joint-graph
    passes run first, as in a real compile (benchmarks/plan_rows.py)."""
    from functorch.compile import make_boxed_func

    from fxremat_passes import _torch_private as tp

    torch._dynamo.reset()
    graphs: list = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    reports: list = []
    if joint_passes:
        from fxremat.backend import FxrematPartitioner

        partitioner = FxrematPartitioner(options, lambda report, key: reports.append(report), as_inductor)
        partition_fn = tp.after_inductor_joint_passes(partitioner)
    else:
        partition_fn = fxremat.make_partition_fn(options, reports, as_inductor=as_inductor)
    model.zero_grad(set_to_none=True)
    loss(torch.compile(model, backend=tp.aot_autograd_as_inductor(partition_fn, keep))(x)).backward()
    fw, bw = graphs
    return fw, bw, reports[0]
