"""CutReport's fields read back by their declarations alone (fxremat/report_fields.py, issue #18): a report with
every kind of field filled round-trips through JSON, and docs/REPORT.md's "Report JSON schema" names every field.  Each
field is declared by one stage record, and ``build_report`` refuses one made twice (fxremat/report.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from fxremat.deferred import Deferred
from fxremat.report import (
    PEAK_FIELDS,
    STAGE_RECORDS,
    CompileFacts,
    CutReport,
    Described,
    RecomputedNode,
    SavedValue,
    SimulatedPeak,
    _declared_once,
    build_report,
)

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "REPORT.md"


def _filled() -> CutReport:
    row = SavedValue("mm", "aten.mm", (4, "s0"), "float32", 64, "64", "mm", True, None, "layer.0", 64)
    return CutReport(
        graph_id="graph_0",
        num_joint_nodes=3,
        saved_bytes=64,
        recompute_flops=8,
        est_recompute_seconds=1e-6,
        saved=(row,),
        recomputed=(RecomputedNode("relu", "aten.relu", 8, 1e-6),),
        saved_symbols=("s0",),
        recompute_reasons=(("relu", "cheap"),),
        region_budgets=(("outside regions", None, 64, None, 64, None), ("r(0.5)", 0.5, 0, 32, 64, 0)),
        backward_checkpoints=("mm",),
        frontier=((64, 0.0, 2.0), (0, 1e-6, 1e6)),
        memory_budget=0.5,
        layout_simulated_peaks=(128, 96),
        memory_timeline=(("forward", "mm", 64),),
        baseline_budget_points=((0.5, 64, 0.0),),
    )


def test_a_filled_report_round_trips_through_json():
    report = _filled()
    assert CutReport.from_dict(json.loads(report.to_json())) == report
    again = CutReport.from_dict({k: v for k, v in report.to_dict().items() if k not in ("saved", "recomputed")})
    assert again.saved == () and again.recomputed == ()  # a row list left out: none


def test_the_schema_names_every_field():
    text = SCHEMA.read_text().split("## Report JSON schema", 1)[1]
    named = {name for line in text.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line)}
    missing = [f.name for f in dataclasses.fields(CutReport) if f.name not in named]
    assert not missing, f"docs/REPORT.md's Report JSON schema has no row for {missing}"


def test_each_field_is_declared_by_one_stage_record():
    names = [f.name for record in STAGE_RECORDS for f in dataclasses.fields(record)]
    assert len(names) == len(set(names))
    assert {f.name for f in dataclasses.fields(CutReport) if f.init} == set(names)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Again:
        saved_bytes: int = 0

    with pytest.raises(TypeError, match=r"declared by two stage records: \['saved_bytes'\]"):
        _declared_once((Described, Again))


_FACTS = CompileFacts(graph_id="graph_0", num_joint_nodes=3)
_DESCRIBED = Described(saved_bytes=64, recompute_flops=0, est_recompute_seconds=0.0, saved=(), recomputed=())


def test_build_report_refuses_a_field_made_twice():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Twice:
        graph_id: str = "twice"

    with pytest.raises(ValueError, match=r"made twice: \['graph_id'\]"):
        build_report(_FACTS, _DESCRIBED, Twice())


def test_deferred_fields_stay_deferred_through_build_and_with_changes():
    calls = []
    deferred = Deferred(lambda: calls.append(1) or {"simulated_peak_bytes": 5})
    report = build_report(_FACTS, _DESCRIBED, SimulatedPeak(**dict.fromkeys(PEAK_FIELDS, deferred)))
    changed = report.with_changes(partition_seconds=1.0)
    assert calls == [] and changed.pending_fields() == PEAK_FIELDS and changed.partition_seconds == 1.0
    assert changed.simulated_peak_bytes == 5 == report.simulated_peak_bytes and calls == [1]
