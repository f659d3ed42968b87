"""The JSON rendering of ``CutReport``: its data (``CutReport.to_dict``), and ``diff_default`` when asked for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..report import CutReport, diff_default


def report_dict(report: CutReport, diff: bool = False) -> dict[str, Any]:
    """``report.to_dict()`` (with ``schema_version``), plus ``diff_default`` when asked for."""
    data = report.to_dict()
    if diff:
        found = diff_default(report)
        data["diff_default"] = (
            None
            if found is None
            else {
                "only_fxremat": [r.name for r in found.only_fxremat],
                "only_default": [r.name for r in found.only_default],
                "both": list(found.both),
            }
        )
    return data


def format_json(report: CutReport, diff: bool = False) -> str:
    """One report as a JSON object; keys sorted so that two runs diff cleanly."""
    return json.dumps(report_dict(report, diff), indent=2, sort_keys=True)


def format_json_many(reports: Sequence[CutReport], diff: bool = False) -> str:
    """Several reports as one JSON array (what the CLI prints when there is no ``--out``)."""
    return json.dumps([report_dict(r, diff) for r in reports], indent=2, sort_keys=True)
