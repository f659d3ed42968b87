"""Offload under ``peak_budget`` at GPU shapes (docs/DESIGN.md §16; ``benchmarks/offload_plan.py``), on the GPT-2
and Llama structures at test sizes: the plan with offloads fits the budget in simulation and is estimated faster
than the recompute-only plan; ``offload=False`` changes nothing; the option is refused where it cannot mean what it
says."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_shaped  # noqa: E402
import offload_plan  # noqa: E402


@pytest.fixture
def small_storages(monkeypatch):
    """The test sizes' storages are all under ``OFFLOAD_MIN_BYTES``: let them be offloaded."""
    import fxremat_passes.choice.offload as offload

    monkeypatch.setattr(offload, "OFFLOAD_MIN_BYTES", 0)


def test_offloads_fit_the_budget_and_beat_recompute_alone(small_storages):
    recompute = offload_plan.plan_row("llama", False, 0.5, small=True)
    offloaded = offload_plan.plan_row("llama", "plan", 0.5, small=True)
    assert recompute["fallback"] is None and offloaded["fallback"] is None
    assert offloaded["offloaded"], "the plan offloads"
    assert offloaded["met"] and offloaded["simulated_peak_bytes"] <= offloaded["peak_budget_bytes"]
    assert offloaded["est_step_seconds"] < recompute["est_step_seconds"]
    for name, nbytes, exposed, _, _ in offloaded["offloaded"]:
        assert nbytes > 0 and exposed >= 0.0
    assert offloaded["exposed_seconds"] == pytest.approx(sum(row[2] for row in offloaded["offloaded"]))


def test_offload_off_leaves_the_plan_as_it_was(small_storages, monkeypatch):
    """With offload off (the default, or False) the offload step never runs, so the plan is the one chosen without
    it; the same step stubbed to fail shows the stub is where ``offload="plan"`` goes."""
    import fxremat_passes.choice.peak as peak

    def entered(*args, **kwargs):
        raise RuntimeError("the offload step ran")

    monkeypatch.setattr(peak, "offloaded_choice", entered)

    def report(options):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return gpu_shaped.partition("gpt2", "fxremat", options, small=True)[0][0]

    for options in (dict(peak_budget=0.5), dict(peak_budget=0.5, offload=False)):
        off = report(options)
        assert off.fallback_reason is None and off.offloaded == () and off.offload_peak_bytes is None
    assert "the offload step ran" in (report(dict(peak_budget=0.5, offload="plan")).fallback_reason or "")


def test_offload_is_refused_where_it_cannot_apply():
    from fxremat import Options

    with pytest.raises(ValueError, match="peak_budget"):
        Options.create(offload="plan")
    with pytest.raises(ValueError, match="False, True or 'plan'"):
        Options.create(peak_budget=0.5, offload="always")
    with pytest.raises(ValueError, match="False, True or 'plan'"):
        Options.create(peak_budget=0.5, offload=1)
    with pytest.raises(ValueError, match="backward_segments"):  # the segmented split would drop the offloads
        Options.create(peak_budget=0.5, offload="plan", backward_segments=True)
    Options.create(peak_budget=0.5, offload="plan", backward_segments=False)


def test_a_profile_without_a_host_link_says_so(small_storages):
    with pytest.warns(UserWarning, match="no host link"):
        gpu_shaped.partition("gpt2", "fxremat", dict(peak_budget=0.5, offload="plan", device="cpu"), small=True)


def test_the_report_lists_each_offloaded_storage(small_storages):
    import fxremat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (report,), _ = gpu_shaped.partition("llama", "fxremat", dict(peak_budget=0.5, offload="plan"), small=True)
    assert report.offloaded
    text = fxremat.format_text(report)
    assert f"offload: {len(report.offloaded)} storages" in text
    for name, *_ in report.offloaded:
        assert f"  {name}: " in text
    data = report.to_dict()
    assert [list(row) for row in data["offloaded"]] == [list(row) for row in report.offloaded]
    assert data["offload_peak_bytes"] <= data["peak_budget_bytes"]


def test_every_placement_the_choice_makes_is_one_the_rewrite_can_make(small_storages, monkeypatch):
    """For every plan the offload choice tries (small Llama at GPU shapes), its offloadable storages placed together
    on its schedule, and the offloads it chooses, rewritten on copies of the plan's split with the waits and
    reloads their placement names: PyTorch's rewrite then moving each wait and reload there never raises
    (``_check_order``: a wait before its offload, a reload after its wait), although the schedule's order is not
    the graphs' (each unit's points and places, ``StepPoints``, ``OffloadUnit.offload_after``, ``reload_by``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fxremat_passes.choice.offload as offload
    from fxremat_passes import _torch_private as tp
    from fxremat_passes._torch_private import offload as tp_offload
    from fxremat_passes.simulator.transfer import place

    if not tp_offload.is_async():
        pytest.skip("the ao ops' waits and reloads are moved on torch 2.13 and later")
    tried: list[dict] = []
    schedule_of, choose_offloads = offload.schedule_of, offload.choose_offloads

    def scheduled(fw, bw, peak, profile):
        tried.append(dict(fw=fw, bw=bw, names=[name for _, name, _ in peak.timeline]))
        return schedule_of(fw, bw, peak, profile)

    def chosen(schedule, units, transfer, target):
        found = choose_offloads(schedule, units, transfer, target)
        tried[-1].update(schedule=schedule, sets=[units, found[0] if found else ()], transfer=transfer)
        return found

    monkeypatch.setattr(offload, "schedule_of", scheduled)
    monkeypatch.setattr(offload, "choose_offloads", chosen)
    offloaded = offload_plan.plan_row("llama", "plan", 0.5, small=True)
    assert offloaded["offloaded"] and offloaded["fallback"] is None
    placed = 0
    for plan in tried:
        schedule, names = plan["schedule"], plan["names"]
        for units in (u for u in plan["sets"] if u):
            placement = place(schedule, list(units), plan["transfer"])
            waits = {u.name: names[w] if w < schedule.forward_points else "" for u, w in zip(units, placement.waits)}
            reloads = {u.name: names[r] for u, r in zip(units, placement.reloads)}
            fw, bw = tp.copy_graph_module(plan["fw"]), tp.copy_graph_module(plan["bw"])
            with FakeTensorMode(allow_non_fake_inputs=True):  # the reloads' cuda metadata
                tp_offload.rewrite_offloads(fw, bw, [u.name for u in units], waits, reloads)
            placed += len(units)
    assert len(tried) >= 2 and placed > 20, "several plans' placements were rewritten"
