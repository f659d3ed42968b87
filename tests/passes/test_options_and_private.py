"""Options validation (bad input names the option and what is allowed), the cache key, and the private-API module."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

import fxremat
from fxremat.backend import FxrematPartitioner, backend_from_compile_args
from fxremat.options import Options, parse_bytes
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.costs import DeviceProfile

# (keyword arguments, exception type, text the message must contain)
BAD_OPTIONS = [
    (dict(memory_budget=-1), ValueError, ">= 0"),
    (dict(memory_budget="abc"), ValueError, "512MiB"),
    (dict(memory_budget=True), TypeError, "bool"),
    (dict(memory_budget=1.5), ValueError, "[0, 1]"),
    (dict(memory_budget=float("nan")), ValueError, "[0, 1]"),
    (dict(memory_budget=[1]), TypeError, "memory_budget"),
    (dict(memory_price=-1.0), ValueError, "memory_price"),
    (dict(memory_price=math.inf), ValueError, "memory_price"),
    (dict(memory_price="high"), TypeError, "memory_price"),
    (dict(device="tpu9"), ValueError, "device"),
    (dict(device=3), TypeError, "device"),
    (dict(solver="magic"), ValueError, "solver"),
    (dict(strict="yes"), TypeError, "strict"),
    (dict(compare_default=1), TypeError, "compare_default"),
    (dict(report_dir=5), TypeError, "report_dir"),
    (dict(verify="yes"), TypeError, "verify"),
    (dict(verify=1), TypeError, "verify"),
    (dict(no_such_option=1), TypeError, "no_such_option"),
    (dict(peak_budget=1.5), ValueError, "lowest-peak"),
    (dict(peak_budget="lots"), ValueError, "peak_budget"),
    (dict(peak_budget=-5), ValueError, "peak_budget"),
]


@pytest.mark.parametrize("kwargs,error,text", BAD_OPTIONS, ids=[str(k) for k, _, _ in BAD_OPTIONS])
def test_bad_options_fail_at_backend_time(kwargs, error, text):
    with pytest.raises(error) as info:
        fxremat.backend(**kwargs)
    assert text in str(info.value)


def test_unknown_compile_options_name_both_option_sets():
    with pytest.raises(ValueError, match="fxremat options are"):
        backend_from_compile_args(None, {"definitely_not_an_option": 1})


def test_compile_options_split_between_fxremat_and_inductor():
    b = backend_from_compile_args(None, {"memory_price": 4.0, "max_autotune": False})
    assert b.options.memory_price == 4.0
    assert b.inductor_config == {"max_autotune": False}


@pytest.mark.parametrize(
    "text,expected", [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1024", 1024), ("1.5KiB", 1536)]
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_budget_of_default_plan_is_accepted():
    assert fxremat.backend(memory_budget=1.0).options.memory_budget == 1.0
    assert fxremat.backend(memory_budget=None).options.memory_budget is None


def test_report_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FXREMAT_REPORT_DIR", str(tmp_path))
    assert Options.create().report_dir == str(tmp_path)
    assert Options.create(report_dir=None).report_dir is None


def test_compare_is_off_by_default_and_one_switch_away(monkeypatch, tmp_path):
    """Issue 16: a production compile runs nothing for the report.  FXREMAT_COMPARE, report_dir (or
    FXREMAT_REPORT_DIR) and compare_budgets turn the comparison on; an explicit compare_default wins."""
    monkeypatch.delenv("FXREMAT_COMPARE", raising=False)
    monkeypatch.delenv("FXREMAT_REPORT_DIR", raising=False)
    assert Options().compare_default is False and Options.create().compare_default is False
    assert fxremat.backend().options.compare_default is False
    assert Options.create(report_dir=str(tmp_path)).compare_default is True
    assert Options.create(report_dir=str(tmp_path), compare_default=False).compare_default is False
    assert Options.create(compare_budgets=True).compare_default is True
    monkeypatch.setenv("FXREMAT_REPORT_DIR", str(tmp_path))
    assert Options.create().compare_default is True
    assert Options.create(report_dir=None).compare_default is False
    monkeypatch.delenv("FXREMAT_REPORT_DIR")
    for text, expected in (("1", True), ("Yes", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv("FXREMAT_COMPARE", text)
        assert Options.create().compare_default is expected, text
    monkeypatch.setenv("FXREMAT_COMPARE", "0")
    assert Options.create(report_dir=str(tmp_path)).compare_default is False  # the switch, set, wins over report_dir
    monkeypatch.setenv("FXREMAT_COMPARE", "1")
    assert Options.create(compare_default=False).compare_default is False  # an explicit option wins
    assert backend_from_compile_args(None, {"memory_price": 7.0}).options.compare_default is True
    monkeypatch.setenv("FXREMAT_COMPARE", "sometimes")
    with pytest.raises(ValueError, match="FXREMAT_COMPARE='sometimes'.*set it to 1"):
        Options.create()


def test_verify_is_off_by_default_and_read_from_environment(monkeypatch):
    monkeypatch.delenv("FXREMAT_VERIFY", raising=False)
    assert Options.create().verify is False
    for text, expected in (("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv("FXREMAT_VERIFY", text)
        assert Options.create().verify is expected, text
    monkeypatch.setenv("FXREMAT_VERIFY", "1")
    assert Options.create(verify=False).verify is False  # an explicit option wins
    monkeypatch.setenv("FXREMAT_VERIFY", "maybe")
    with pytest.raises(ValueError, match="FXREMAT_VERIFY='maybe'.*set it to 1"):
        Options.create()


def test_verify_changes_no_cache_key():
    """Checking a plan changes no partition: a cache filled without verify serves a verifying run (and so the
    warm-cache path is verified too, tests/e2e/test_verify_inductor.py)."""
    assert Options.create(verify=True).cache_key() == Options.create(verify=False).cache_key()
    assert "verify" not in Options.create(verify=True).cache_key()
    on, off = (FxrematPartitioner(Options.create(verify=v), print).uuid() for v in (True, False))
    assert on == off
    assert backend_from_compile_args(None, {"verify": True}).options.verify is True


def test_device_profiles():
    assert Options.create(device="h100").profile_for("cpu").name == "h100"
    assert Options.create().profile_for("cpu").name == "cpu"
    assert Options.create().profile_for("cuda", "NVIDIA H200").name == "h200"
    custom = DeviceProfile("mine", (("default", 1e12),), 1e11)
    assert Options.create(device=custom).profile_for("cuda", "NVIDIA A100").name == "mine"
    with pytest.raises(ValueError, match="default"):
        DeviceProfile("bad", (("float32", 1e12),), 1e11)


def test_uuid_covers_every_option():
    """Changing any option changes the cache key (a stale cached partition is a silent wrong choice)."""
    base = Options.create()
    variants = [
        Options.create(memory_price=3.0),
        Options.create(device="a100"),
        Options.create(compare_default=True),
        Options.create(strict=True),
        Options.create(memory_budget=1.0),
    ]
    uuids = {FxrematPartitioner(o, print).uuid() for o in [base, *variants]}
    assert len(uuids) == 1 + len(variants)
    assert FxrematPartitioner(Options.create(), print).uuid() == FxrematPartitioner(base, print).uuid()


def test_partitioner_pickles_without_its_report_sink():
    import pickle

    b = fxremat.backend(memory_price=5.0)
    clone = pickle.loads(pickle.dumps(b._partitioner))
    assert clone.uuid() == b._partitioner.uuid()


def test_private_helpers_import_and_version_gate():
    for name in tp.__all__:
        assert getattr(tp, name) is not None, name
    from fxremat_passes._torch_private import inductor_entry, scheduler

    assert "custom_partitioner_fn" in inductor_entry.inductor_config_names()
    assert inductor_entry.inductor_mode_options("max-autotune")["max_autotune"] is True
    assert inductor_entry.inductor_cache_dir().name and callable(inductor_entry.compile_fx)
    assert inductor_entry.boxed(lambda *args: [len(args)])([1, 2]) == [2]
    assert callable(scheduler.inductor_keeps_mutation_order) and callable(scheduler.inductor_vetoes_dragging_fusions)
    assert tp.unsupported_torch_reason() is None  # the torch we test with is a supported one
    for supported in ("2.11.0", "2.12.1", "2.13.0", "2.14.1+cpu", "2.11.0+cu130"):
        assert tp.unsupported_torch_reason(supported) is None, supported
    assert tp.unsupported_torch_reason("2.10.0") is not None
    assert "2.11" in tp.unsupported_torch_reason("2.15.0")
    assert "2.14" in tp.unsupported_torch_reason("3.0.0")


def _copy_all(graph, copy):
    """Every node of ``graph`` copied into a new graph with ``copy(new_graph, node, lookup)``, twice over (the
    second round's names collide with the first's, so the namespace has to rename them)."""
    import torch.fx as fx

    new = fx.Graph()
    for _ in range(2):
        env = {}
        for node in graph.nodes:
            if node.op != "output":
                env[node] = copy(new, node, env.__getitem__)
    return new


def test_copy_node_is_node_copy():
    import operator

    import torch
    import torch.fx as fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = "a tensor"
    cat = graph.call_function(torch.cat, ([x, x],), {"dim": 0})
    item = graph.call_function(operator.getitem, (cat, slice(0, 1)))
    graph.call_function(torch.sum, (item,), {"dim": [0, 1], "dtype": None})
    graph.call_function(torch.relu, (x,))  # no kwargs
    ours = _copy_all(graph, tp.copy_node)
    theirs = _copy_all(graph, lambda g, node, lookup: g.node_copy(node, lookup))
    assert [n.name for n in ours.nodes] == [n.name for n in theirs.nodes] and "x_1" in [n.name for n in ours.nodes]
    for a, b in zip(ours.nodes, theirs.nodes):
        fields = (a.op, a.target, str(a.args), str(a.kwargs), a.type, type(a.args), type(a.kwargs))
        assert fields == (b.op, b.target, str(b.args), str(b.kwargs), b.type, type(b.args), type(b.kwargs))
        assert [u.name for u in a.users] == [u.name for u in b.users]
        assert a.meta == b.meta
    original = next(iter(graph.nodes))
    copied = next(iter(ours.nodes))
    assert copied.meta is not original.meta  # a copy of the dict, not the dict itself
    for graph_ in (ours, theirs):
        graph_.lint()
    assert len(ours.nodes) == len(theirs.nodes) == 2 * len(graph.nodes)
    assert [n.name for n in ours.find_nodes(op="call_function", target=torch.cat)] == ["cat", "cat_1"]
    assert ours.python_code("self").src == theirs.python_code("self").src


def test_placement_predicates_are_pytorchs_memoised():
    """Every (partitioner tag, target) pair, mutable and not, asked twice (the second answer from the memo): the
    same answers as PyTorch's own predicates."""
    import torch
    import torch.fx as fx
    from torch._functorch import partitioners

    graph = fx.Graph()
    x = graph.placeholder("x")
    nodes = []
    for tag in (None, "is_backward", "must_be_in_backward", "must_be_in_forward", "something else"):
        for target in (torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.copy_.default):
            node = graph.call_function(target, (x, x))
            if tag is not None:
                node.meta["partitioner_tag"] = tag
            nodes.append(node)
    tp._PLACEMENT.clear()
    for _ in range(2):
        for node in nodes:
            assert tp.must_be_in_forward(node) == bool(partitioners._must_be_in_forward(node)), node.meta
            assert tp.must_be_in_backward(node) == bool(partitioners._must_be_in_backward(node)), node.meta
    assert any(tp.must_be_in_forward(n) for n in nodes) and any(tp.must_be_in_backward(n) for n in nodes)
    assert not all(tp.must_be_in_forward(n) for n in nodes)


def test_unsupported_torch_warns_once_and_uses_default(monkeypatch):
    import importlib

    import torch

    from fxremat.examples import example

    backend_module = importlib.import_module("fxremat.backend")  # the module, not the function of that name

    monkeypatch.setattr(tp, "unsupported_torch_reason", lambda version=None: "torch 9.9 is not tested")
    monkeypatch.setattr(backend_module, "_warned_unsupported", False)
    calls = []
    monkeypatch.setattr(
        "torch._inductor.compile_fx.compile_fx",
        lambda gm, inputs, config_patches=None: calls.append(config_patches) or gm,
    )
    b = fxremat.backend()
    model, inputs = example("mlp")
    gm = torch.fx.symbolic_trace(model)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b(gm, list(inputs))
        b(gm, list(inputs))
    assert [str(w.message) for w in caught if "not tested" in str(w.message)] == ["torch 9.9 is not tested"]
    assert calls == [None, None]  # no custom partitioner patched in
    assert b.reports == []


def test_functorch_knobs_and_region_annotation_are_readable():
    """Every torch._functorch.config knob fxremat reads or warns about exists in this torch, with a default; the
    region budget annotation is read back off a node as PyTorch's partitioner reads it."""
    import torch.fx

    from fxremat import knobs

    for name in (knobs.TORCH_BUDGET, *knobs.IGNORED_KNOBS):
        assert tp.functorch_knob(name) == tp.functorch_knob_default(name), name
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    assert tp.memory_budget_annotation(node) is None
    node.meta["custom"] = {tp.MEMORY_BUDGET_ANNOTATION_KEY: 0.25}
    assert tp.memory_budget_annotation(node) == 0.25


def test_cache_key_hashes_every_pass_source():
    """The partitioner's uuid (AOTAutograd's and Inductor's cache keys) hashes passes/ too: a changed pass must not
    reuse partitions cached before it (issue #19: passes/simulator/layout.py's edits did)."""
    import importlib
    from pathlib import Path

    import fxremat_passes

    backend_module = importlib.import_module("fxremat.backend")  # fxremat.backend is also the function

    hashed = {p.resolve() for d in backend_module._PACKAGE_DIRS for p in d.rglob("*.py")}
    for package in (Path(fxremat_passes.__file__).resolve().parent, Path(backend_module.__file__).resolve().parent):
        assert set(package.rglob("*.py")) <= hashed, sorted(set(package.rglob("*.py")) - hashed)
    assert Path(backend_module.__file__).resolve() in hashed


def test_importing_fxremat_does_not_import_scipy():
    # torch.compile(backend="fxremat") imports fxremat even when Inductor's cache answers and nothing is
    # partitioned: scipy (0.2-0.4 s) waits for the first solve (passes/solver/mincut.py; issue #16's warm-cache time)
    code = "import sys, fxremat; assert not [m for m in sys.modules if m.split('.')[0] == 'scipy'], 'scipy imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_default_partition_imports_the_max_flow_but_not_the_milp():
    # the first partition of a process pays for the scipy it imports (benchmarks/RESULTS.md, "Partition time, session
    # 24": scipy.sparse.csgraph 0.14-0.19 CPU s, unavoidable for the max-flow); scipy.optimize (HiGHS, 0.1 s more)
    # serves budgets and solver="milp" alone, so the default plan must not import it
    code = (
        "import sys, torch, fxremat\n"
        "from functorch.compile import aot_module, make_boxed_func\n"
        "from fxremat.examples import example\n"
        "from fxremat.options import Options\n"
        "model, inputs = example('stack')\n"
        "noop = lambda gm, _: make_boxed_func(gm.forward)\n"
        "reports = []\n"
        "partition_fn = fxremat.make_partition_fn(Options.create(), reports)\n"
        "aot_module(model, fw_compiler=noop, partition_fn=partition_fn)(*inputs).sum().backward()\n"
        "assert reports and reports[0].fallback_reason is None and reports[0].plan_method == 'mincut'\n"
        "assert 'scipy.sparse.csgraph' in sys.modules, 'no max-flow'\n"
        "assert 'scipy.optimize' not in sys.modules, 'scipy.optimize imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_fxremat_leaves_the_partitioner_for_the_first_partition():
    # a warm compile (an AOTAutograd cache hit) never partitions: the choice, the split, the solvers, the simulator
    # (layout_choice), verify and PyTorch's knobs load on first use (benchmarks/RESULTS.md, sessions 24-25: fxremat's
    # import 0.125 -> 0.036 s), and the names fxremat exports from them still resolve
    code = (
        "import sys, fxremat, fxremat.backend\n"
        "fxremat.backend(memory_budget=0.5, device='cpu')\n"
        "sys.modules['fxremat.backend'].LayoutChoice()  # a CPU graph's compile, warm or cold, makes one\n"
        "later = ['fxremat_passes.choice', 'fxremat.partition', 'fxremat_passes.solver.solvers', 'fxremat_passes.simulator.liveness',\n"
        "         'fxremat.verify', 'fxremat.knobs', 'fxremat_passes.graph.roles']\n"
        "assert not [m for m in later if m in sys.modules], [m for m in later if m in sys.modules]\n"
        "assert fxremat.FxrematBudgetWarning.__module__.startswith('fxremat_passes.choice')\n"
        "assert issubclass(fxremat.FxrematFallbackWarning, Warning) and callable(fxremat.format_text)\n"
        "assert issubclass(fxremat.FxrematKnobWarning, Warning) and issubclass(fxremat.FxrematVerifyWarning, Warning)\n"
        "assert issubclass(fxremat.FxrematVerifyError, Exception)\n"
        "assert 'fxremat.partition' in sys.modules and 'fxremat.verify' in sys.modules\n"
        "try:\n"
        "    fxremat.backend(solver='nope')\n"
        "except ValueError as error:\n"
        "    assert 'mincut' in str(error)\n"
        "else:\n"
        "    raise AssertionError('an unknown solver must be refused')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
