"""benchmarks/peak_milp_gap.py on the MLP example: one row per fxremat setting, each a plan of the schedule graph,
and the MILP's peak never above it (aot_module, no-op compilers, no Inductor)."""

from __future__ import annotations

from peak_milp_gap import SETTINGS, format_table, rows_for, summary


def test_every_setting_gets_a_row_and_the_milp_is_never_above_it():
    rows = rows_for("mlp", time_limit=20, saved_cap=True)
    assert [r["setting"] for r in rows] == list(SETTINGS)
    for row in rows:
        assert row["optimal"] and row["peak_milp"] <= row["peak_ours"] and row["gap"] >= 0
        if row["setting"].startswith("memory_budget"):  # held to the plan's saved bytes too: never below P*
            assert row["optimal_capped"] and row["peak_milp"] <= row["peak_milp_capped"] <= row["peak_ours"]
    assert "proven optimal" in summary(rows) and "| mlp" in format_table(rows, saved_cap=True)
