"""CutReport's fields read back by their declarations alone (fxremat/report_fields.py, issue #18): a report with
every kind of field filled round-trips through JSON, and README's "Report JSON schema" names every field."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from fxremat.report import CutReport, RecomputedNode, SavedValue

README = Path(__file__).resolve().parents[2] / "README.md"


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


def test_the_readme_schema_names_every_field():
    text = README.read_text().split("## Report JSON schema", 1)[1]
    named = {name for line in text.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line)}
    missing = [f.name for f in dataclasses.fields(CutReport) if f.name not in named]
    assert not missing, f"README's Report JSON schema has no row for {missing}"
