"""benchmarks/zoo.py: which rows it runs (resumable), the checks it judges, and one model end to end at the tiny size
(real Inductor, both loss sides): every row measured, gradients right against fp64."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import zoo  # noqa: E402
import zoo_checks  # noqa: E402
import zoo_models  # noqa: E402


def _row(config, peak, step=10.0, sim=None, side="outside", model="m", right=True):
    return dict(model=model, size="tiny", loss_side=side, config=config, peak_bytes=peak, step_ms=step,
                simulated_peak_bytes=sim, sim_error=None if sim is None else sim / peak - 1, error=None,
                gradients=dict(grads_right=right))


def test_pending_skips_done_rows_and_retries_errors_only_when_asked():
    args = zoo.parse_args(["--models", "llama", "--configs", "pytorch_default", "fxremat_default", "--size", "tiny"])
    done = [dict(model="llama", size="tiny", loss_side="inside", config="pytorch_default", error=None),
            dict(model="llama", size="tiny", loss_side="outside", config="fxremat_default", error="boom")]
    todo = zoo.pending(args, done)
    assert ("llama", "tiny", "inside", "pytorch_default") not in todo
    assert ("llama", "tiny", "outside", "fxremat_default") not in todo
    assert len(todo) == 2
    args.retry_errors = True
    assert ("llama", "tiny", "outside", "fxremat_default") in zoo.pending(args, done)


def test_checks_judge_lowest_peak_monotone_simulation_and_pytorch_match():
    rows = [_row("pytorch_budget_0.5", 100, step=10.0), _row("pytorch_budget_0.2", 80, step=12.0),
            _row("fxremat_default", 120, sim=121), _row("fxremat_budget_0.5", 90, step=9.0, sim=95),
            _row("fxremat_budget_0.2", 85, step=11.0, sim=97), _row("fxremat_peak_0.0", 79, step=13.0, sim=70)]
    record = zoo_checks.checks(rows)[("m", "tiny", "outside")]
    assert record["lowest_peak"]["ok"] and record["lowest_peak"]["lowest"] == "fxremat_peak_0.0"
    assert record["monotone"]["worst_rise"] == pytest.approx(97 / 95 - 1) and not record["monotone"]["ok"]
    assert not record["sim_ok"]  # peak_0.0 simulated 11% low
    matched = record["pytorch_matched"]
    assert matched["pytorch_budget_0.5"]["match"] == "fxremat_budget_0.5" and matched["pytorch_budget_0.5"]["ok"]
    assert matched["pytorch_budget_0.2"]["match"] == "fxremat_peak_0.0" and not matched["pytorch_budget_0.2"]["ok"]
    assert record["gradients_right"]
    assert "**no**" in zoo_checks.table(rows)


def test_unknown_rows_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="models"):
        zoo_models.build("nope", "tiny", "inside")


@pytest.mark.inductor
def test_one_model_end_to_end_both_loss_sides(tmp_path):
    out = tmp_path / "zoo.json"
    argv = ["--models", "llama", "--size", "tiny", "--configs", "fxremat_default", "--in-process", "--repeats", "1",
            "--json", str(out)]
    assert zoo.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["loss_side"] for r in rows} == {"inside", "outside"}
    for row in rows:
        assert row["error"] is None, row
        assert row["gradients"]["grads_right"] and row["gradients"]["params"] > 0
        assert row["peak_bytes"] > 0 and row["step_ms"] > 0 and row["graphs"] == 1
        assert isinstance(row["simulated_peak_bytes"], int) and row["environment"]["torch"]
    assert zoo.pending(zoo.parse_args(argv), rows) == []  # a second run has nothing left to do
