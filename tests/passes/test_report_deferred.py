"""The report's simulated-peak fields are computed on their first read, not while partitioning, from the split's own
recipe: the same values as simulating the returned graphs right away, however those graphs are changed afterwards
(Inductor rewrites the graphs it gets in place)."""

from __future__ import annotations

import copy
import importlib
import json
import pickle

import pytest
from helpers import run_aot

import fxremat
from fxremat import report as report_module
from fxremat import simulated
from fxremat.examples import example
from fxremat.options import Options
from fxremat.report import DEFERRED_FIELDS
from fxremat_passes.choice import judged
from fxremat_passes.simulator import liveness


def _partition(name: str, monkeypatch, **options):
    """One training step of an example; returns (report, simulations run while partitioning, the simulation of the
    returned graphs made as they came back, those graphs)."""
    calls = []
    real_simulate = simulated.simulate_step
    counted = lambda *a, **k: calls.append(1) or real_simulate(*a, **k)  # noqa: E731
    monkeypatch.setattr(simulated, "simulate_step", counted)
    monkeypatch.setattr(judged, "simulate_step", counted)  # where plans are chosen by their simulation
    reports, returned = [], {}
    inner = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)

    def partition_fn(gm, joint_inputs, **kwargs):
        fw, bw = inner(gm, joint_inputs, **kwargs)
        returned.update(fw=fw, bw=bw, peak=liveness.simulate_step(fw, bw, kwargs["num_fwd_outputs"]))
        return fw, bw

    model, inputs = example(name)
    run_aot(model, inputs, partition_fn)
    (report,) = reports
    return report, len(calls), returned, calls


def _forget_values(gm) -> None:
    """What a rewrite of the graph in place could do to a simulation that read it: no tensor sizes left."""
    for node in gm.graph.nodes:
        node.meta.pop("val", None)


@pytest.mark.parametrize("compare_default", [False, True])
def test_simulation_runs_on_first_read_and_ignores_later_rewrites(monkeypatch, compare_default):
    report, during, returned, calls = _partition("stack", monkeypatch, compare_default=compare_default)
    assert during == 0, "the partition simulated a step its report had not been asked for"
    _forget_values(returned["fw"])
    _forget_values(returned["bw"])
    peak = returned["peak"]
    assert report.simulated_peak_bytes == peak.peak_bytes > 0
    assert report.simulated_activation_peak_bytes == peak.activation_peak_bytes
    assert report.simulated_peak_at == f"{peak.peak_phase}:{peak.peak_node}"
    assert report.memory_timeline == simulated.timeline(peak)
    if compare_default:
        assert report.baseline_simulated_peak_bytes > 0 and report.baseline_memory_timeline
    assert len(calls) == (2 if compare_default else 1)  # one simulation per split, for all its fields
    report.to_dict()
    assert len(calls) == (2 if compare_default else 1)


def test_to_dict_can_leave_deferred_fields_uncomputed(monkeypatch):
    """compute_deferred=False writes what is known and runs no simulation: pending fields as their defaults."""
    report, _, returned, calls = _partition("stack", monkeypatch, compare_default=True)
    assert set(report.pending_fields()) == set(DEFERRED_FIELDS)
    data = report.to_dict(compute_deferred=False)
    assert calls == [] and set(report.pending_fields()) == set(DEFERRED_FIELDS)
    assert all(data[name] in (None, ()) for name in DEFERRED_FIELDS)
    assert data["saved_bytes"] == report.saved_bytes and data["baseline_saved_bytes"] == report.baseline_saved_bytes
    report.simulated_peak_at  # one read computes our split's fields, all of them, and only those
    pending = set(report_module.BASELINE_PEAK_FIELDS) | set(report_module.STEP_FIELDS)
    assert len(calls) == 1 and set(report.pending_fields()) == pending
    data = report.to_dict(compute_deferred=False)
    assert data["simulated_peak_bytes"] == returned["peak"].peak_bytes and data["memory_timeline"]
    assert data["baseline_simulated_peak_bytes"] is None and len(calls) == 1
    assert report.to_dict()["baseline_simulated_peak_bytes"] > 0 and len(calls) == 2


def test_to_dict_is_asdict_and_the_one_line_json_the_same_object(monkeypatch):
    """to_dict converts without asdict's deep copy of every leaf: the same dict, and to_json(indent=None) (the
    report store's) the same object in one line."""
    import dataclasses

    from fxremat.report import SCHEMA_VERSION

    report, *_ = _partition("block_sdpa", monkeypatch, compare_default=True, compare_budgets=True, memory_budget=0.5)
    assert report.saved and report.baseline_saved and report.recomputed and report.frontier
    assert report.to_dict() == {**dataclasses.asdict(report), "schema_version": SCHEMA_VERSION}
    one_line = report.to_json(indent=None)
    assert "\n" not in one_line and json.loads(one_line) == json.loads(report.to_json())
    # to_json encodes the rows itself (report._json_row): the very text of encoding to_dict()
    for indent in (None, 2):
        assert report.to_json(indent=indent) == json.dumps(report.to_dict(), indent=indent, sort_keys=True)
        pending = json.dumps(report.to_dict(compute_deferred=False), indent=indent, sort_keys=True)
        assert report.to_json(compute_deferred=False, indent=indent) == pending


@pytest.mark.parametrize(
    "options,simulated",
    [
        (dict(), False),  # the default: the store keeps no deferred field
        (dict(compare_default=True), True),
        (dict(compare_default=False, report_dir="REPORT_DIR"), True),  # report files are full reports
    ],
)
def test_report_store_simulates_only_what_was_asked_for(monkeypatch, tmp_path, options, simulated):
    """FxrematBackend stores each report for warm-cache re-emission (issue 16): with the defaults the stored JSON
    has null peaks and no simulation runs; the in-process report still computes them when read."""
    backend_module = importlib.import_module("fxremat.backend")  # the module, not the function of that name
    monkeypatch.delenv("FXREMAT_COMPARE", raising=False)
    monkeypatch.delenv("FXREMAT_REPORT_DIR", raising=False)
    store = tmp_path / "store"
    monkeypatch.setattr(backend_module, "report_store_dir", lambda: store)
    options = {k: str(tmp_path / "dir") if v == "REPORT_DIR" else v for k, v in options.items()}
    report, _, returned, calls = _partition("stack", monkeypatch, **options)
    backend = fxremat.backend(**options)
    backend._record(report, "key")
    backend._write_reports()
    stored = json.loads((store / "key.json").read_text())
    expected_calls = (2 if backend.options.compare_default else 1) if simulated else 0
    assert len(calls) == expected_calls
    if simulated:
        assert stored["simulated_peak_bytes"] == returned["peak"].peak_bytes
        assert stored["memory_timeline"]
    else:
        assert stored["simulated_peak_bytes"] is None and stored["memory_timeline"] == []
        assert stored["baseline_saved_bytes"] is None  # nor was anything compared
        assert report.simulated_peak_bytes == returned["peak"].peak_bytes and len(calls) == 1  # read: computed
    if "report_dir" in options:
        (written,) = (tmp_path / "dir").glob("*.json")
        assert json.loads(written.read_text())["simulated_peak_bytes"] == returned["peak"].peak_bytes
    # a warm compile cache re-emits what was stored, and says when it has no peaks
    again = fxremat.backend(**options)
    again._reemit_cached_report("key")
    (cached,) = again.reports
    assert cached.from_cache and cached.saved_bytes == report.saved_bytes
    text = fxremat.format_text(cached)
    if simulated:
        assert cached.simulated_peak_bytes == returned["peak"].peak_bytes and "not stored" not in text
    else:
        assert cached.simulated_peak_bytes is None
        assert "simulated step peak: not stored with the compile-cache entry" in text


def test_forward_with_convolutions_is_simulated_while_partitioning(monkeypatch):
    """Inductor's layout decision for a convolution depends on config in force during the compile only."""
    report, during, returned, _ = _partition("convnet", monkeypatch, compare_default=False)
    assert during == 1
    assert report.simulated_peak_bytes == returned["peak"].peak_bytes


def test_peak_budget_reports_the_simulation_it_chose_by(monkeypatch):
    report, during, returned, calls = _partition("stack", monkeypatch, compare_default=False, peak_budget=0.0)
    # the shortlist is judged by its plans' estimates, each the simulation of the plan's split made without it
    assert during == 0 and report.peak_simulated >= 2
    assert report.simulated_activation_peak_bytes == returned["peak"].activation_peak_bytes
    assert len(calls) == during
    # choosing the plan simulated it: the report store keeps that peak without asking for more (the step's
    # estimate, no simulation, stays deferred)
    assert report.pending_fields() == report_module.STEP_FIELDS
    assert report.to_dict(compute_deferred=False)["simulated_peak_bytes"] == returned["peak"].peak_bytes


def test_pickled_and_copied_reports_carry_values(monkeypatch):
    report, _, returned, _ = _partition("mlp", monkeypatch, compare_default=False)
    for clone in (pickle.loads(pickle.dumps(report)), copy.deepcopy(report)):
        assert clone == report
        assert clone.simulated_peak_bytes == returned["peak"].peak_bytes
        assert all(f"_{name}" in vars(clone) for name in DEFERRED_FIELDS)


def test_the_deferred_field_lists_name_every_deferrable_report_field():
    """The partition fills deferred fields by these two lists: a report field missing from both stays at its
    default forever."""
    names = report_module.PEAK_FIELDS + report_module.BASELINE_PEAK_FIELDS + report_module.STEP_FIELDS
    assert sorted(names) == sorted(DEFERRED_FIELDS)


@pytest.mark.parametrize("name", ["block_sdpa", "stack"])
def test_the_step_estimate_is_deferred_and_prices_every_node_of_the_split(monkeypatch, name):
    """``est_step_seconds`` is priced later on the recipe's own copy of the split: the same as pricing the returned
    graphs now, however their computations are rewritten afterwards (the forward's graph inputs keep the joint
    graph's meta, ``split._build``: their sizes are the compile's inputs'); the recomputation is part of it."""
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.rewrite.describe import step_seconds

    report, _, returned, _ = _partition(name, monkeypatch, compare_default=False, memory_budget=0.0)
    assert "est_step_seconds" in report.pending_fields()
    expected = step_seconds([*returned["fw"].graph.nodes, *returned["bw"].graph.nodes], PROFILES["cpu"])
    for node in [*returned["fw"].graph.nodes, *returned["bw"].graph.nodes]:
        if node.op != "placeholder" or node.graph is returned["bw"].graph:
            node.meta.pop("val", None)
    assert report.est_step_seconds == pytest.approx(expected)
    assert report.est_step_seconds > report.est_recompute_seconds > 0
