"""benchmarks/investigations/peak_milp_gap.py on the MLP example: one row per fxremat setting,
each a plan of the schedule graph, and the MILP's peak never above it (aot_module, no-op compilers, no Inductor)."""

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


def test_a_segmented_plan_is_marked_and_left_out_of_the_summary():
    """The MILP schedules a plan's saved set recomputed lazily; a plan run segment by segment in backward is not
    that schedule, so its row says so and its gap is not counted."""
    row = dict(graph="g", setting="memory_budget=0.5", nodes=3, stages=2, peak_ours=10, compute_ours_us=1.0)
    row.update(saved_ours=4, peak_milp=8, lower_bound=8, floor=6, optimal=True, solve_s=0.1)
    plain = dict(row, gap=0.25, gap_capped=0.0, peak_milp_capped=10, optimal_capped=True)
    segmented = dict(plain, graph="h", segmented=True, gap=None, gap_capped=None)
    peak = dict(row, setting="peak_budget=0.0", segmented=True, gap=None)  # no capped columns
    text = summary([plain, segmented, peak])
    assert "1 of 3 rows" in text and "worst 25.00%" in text and "2 segmented, left out" in text
    table = format_table([plain, segmented, peak], saved_cap=True).splitlines()
    assert "segmented" in table[-2] and "segmented" in table[-1]


def test_the_step_peak_keeps_gradients_and_the_activation_peak_does_not():
    """``--peak step`` (the default) keeps each gradient to the step's end: never a lower peak than handing it over,
    on every plan, and the optimum is never below the floor every schedule meets."""
    step, activation = rows_for("mlp", time_limit=20), rows_for("mlp", time_limit=20, step_peak=False)
    for s, a in zip(step, activation):
        assert (s["peak"], a["peak"]) == ("step", "activation")
        assert s["peak_ours"] >= a["peak_ours"] and s["peak_milp"] >= a["peak_milp"] >= a["floor"]
    assert any(s["peak_ours"] > a["peak_ours"] for s, a in zip(step, activation))  # the gradients count
    assert "at the floor" in summary(step)
