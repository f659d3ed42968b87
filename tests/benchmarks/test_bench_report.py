"""The orchestrator's bookkeeping and the output formatting, on hand-made rows (no compiling)."""

import json

import bench_report as br
import run


def _row(model, config, saved=100, peak=1000, step=2.0, **extra):
    return dict(model=model, config=config, saved_bytes=saved, peak_bytes=peak, step_ms=step, error=None, **extra)


def test_ratios_are_against_the_same_models_pytorch_default():
    rows = br.add_ratios([_row("a", "pytorch_default"), _row("a", "fxremat_default", saved=50, step=3.0),
                          _row("b", "fxremat_default")])
    assert rows[1]["saved_ratio"] == 0.5 and rows[1]["step_ratio"] == 1.5 and rows[1]["peak_ratio"] == 1.0
    assert rows[2]["saved_ratio"] is None  # model b has no baseline row


def test_budget_comes_from_the_measured_pytorch_budget_row():
    rows = [_row("a", "pytorch_budget_0.5", saved=1234), _row("b", "pytorch_budget_0.5", saved=9)]
    assert run.budget_for("a", "fxremat_at_pytorch_0.5", rows) == (1234, None)
    assert run.budget_for("a", "fxremat_default", rows) == (None, None)
    budget, why = run.budget_for("a", "fxremat_at_pytorch_0.1", rows)
    assert budget is None and "pytorch_budget_0.1" in why


def test_plan_puts_budget_sources_before_their_users():
    runs = run.plan(["m"], ["fxremat_at_pytorch_0.1", "pytorch_budget_0.1", "pytorch_default"])
    assert runs == [("m", "pytorch_default"), ("m", "pytorch_budget_0.1"), ("m", "fxremat_at_pytorch_0.1")]


def test_a_failing_run_becomes_an_error_row_and_the_others_go_on():
    def runner(model, config, budget):
        if model == "bad":
            raise RuntimeError("boom")
        return _row(model, config)

    rows = run.run_all([("bad", "pytorch_default"), ("good", "pytorch_default")], runner, "tiny")
    assert rows[0]["error"] == "RuntimeError: boom" and rows[1]["error"] is None


def test_worker_output_is_the_last_marked_line():
    row = _row("a", "pytorch_default")
    stdout = f"noise\n{run.ROW_MARKER}{json.dumps({'old': 1})}\nmore noise\n{run.ROW_MARKER}{json.dumps(row)}\n"
    assert run.parse_worker_output(stdout) == row
    assert run.parse_worker_output("no result here") is None


def test_markdown_table_has_one_line_per_row_and_shows_errors():
    rows = br.add_ratios([_row("a", "pytorch_default", grads_matched=True),
                          dict(model="a", config="fxremat_default", error="ValueError: bad | thing\nmore")])
    lines = br.markdown_table(rows).strip().splitlines()
    assert len(lines) == 4 and all(line.count("|") == len(br.HEADERS) + 1 for line in lines)
    assert "error: ValueError: bad / thing" in lines[3]


def test_a_missing_transformers_gives_an_error_row(monkeypatch):
    import sys

    import bench_measure as bm

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    row = bm.measure_or_error("gpt2", "tiny", "pytorch_default", 1, "cpu")
    assert row["model"] == "gpt2" and row["config"] == "pytorch_default"
    assert row["error"].startswith(("ModuleNotFoundError", "ImportError")), row["error"]
