"""benchmarks/compile_time.py: the record's fields and the run order, never its times (this machine is shared)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import compile_time as ct
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compile_time.py"


def test_both_orders_alternate():
    configs = list(ct.CONFIGS)
    assert [ct.order_for(r, configs) for r in range(3)] == [configs, configs[::-1], configs]


def _row(config, cache, seconds, kernels, partition=None, cpu=None):
    return dict(
        model="mlp",
        config=config,
        cache=cache,
        error=None,
        process_s=seconds,
        process_cpu_s=seconds * 0.9 if cpu is None else cpu,
        compile_step_s=seconds / 2,
        kernels=kernels,
        kernels_forward=1,
        kernels_backward=kernels - 1,
        partition_s=partition,
    )


def test_summary_has_medians_spread_and_ratio():
    rows = [_row("inductor_default", "cold", s, 4) for s in (10.0, 12.0, 11.0)]
    rows += [_row("fxremat_default", "cold", s, 4, 0.01, cpu=s) for s in (11.0, 13.0, 12.0)]
    (cold, warm) = ct.summarise(rows, list(ct.CONFIGS))
    assert cold["inductor_default"]["process_s"] == dict(n=3, median=11.0, min=10.0, max=12.0)
    assert cold["fxremat_default"]["partition_s"] == 0.01
    assert cold["ratio"] == pytest.approx(12.0 / 11.0)
    assert cold["fxremat_default"]["process_cpu_s"]["median"] == 12.0
    assert cold["cpu_ratio"] == pytest.approx(12.0 / (11.0 * 0.9))  # CPU medians, not the wall times
    assert warm["ratio"] is None and warm["inductor_default"]["process_s"]["n"] == 0
    assert "| mlp | cold |" in ct.markdown_table([cold, warm])
    assert "| 9.90 / 12.00 | 1.212x |" in ct.markdown_table([cold, warm])


def test_warm_rounds_reuse_each_cold_cache_in_alternating_orders(monkeypatch):
    calls = []

    def fake_worker(model, config, size, cache, cache_dir, timeout, check):
        calls.append((config, cache, cache_dir))
        return dict(model=model, config=config, cache=cache, error=None, process_s=1.0)

    monkeypatch.setattr(ct, "run_worker", fake_worker)
    args = ct.parse_args(["--models", "mlp", "--repeats", "2", "--warm-rounds", "2"])
    rows = ct.run_model(args, "mlp", lambda row: None)
    ind, fx = ct.CONFIGS
    assert [(c, k) for c, k, _ in calls] == [
        (ind, "cold"), (fx, "cold"), (fx, "warm"), (ind, "warm"), (ind, "warm"), (fx, "warm"),
        (fx, "cold"), (ind, "cold"), (ind, "warm"), (fx, "warm"), (fx, "warm"), (ind, "warm"),
    ]  # fmt: skip
    first_dirs = {c: d for c, k, d in calls[:2]}
    assert all(d == first_dirs[c] for c, _, d in calls[2:6])  # the warm rounds run on the cold run's cache
    assert [r["round"] for r in rows[:6]] == [0, 0, 1, 1, 2, 2]


def test_paired_ratio_compares_the_runs_of_one_round():
    rows = []
    for round_number, (ind, fx) in enumerate([(10.0, 10.5), (20.0, 20.0), (10.0, 11.0)]):
        rows += [dict(_row("inductor_default", "warm", ind, 4), repeat=0, round=round_number)]
        rows += [dict(_row("fxremat_default", "warm", fx, 4), repeat=0, round=round_number)]
    (_, warm) = ct.summarise(rows, list(ct.CONFIGS))
    assert warm["paired_ratio"] == dict(n=3, median=pytest.approx(1.05), min=1.0, max=pytest.approx(1.1))
    assert warm["ratio"] == pytest.approx(11.0 / 10.0)  # medians of each: 11 over 10
    assert "1.050x [1.000-1.100]" in ct.markdown_table([warm])


@pytest.mark.inductor
def test_quick_records_every_field(tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "unused")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["settings"]["quick"] is True and record["environment"]["threads"] == 1
    rows = record["rows"]
    assert {(r["config"], r["cache"]) for r in rows} == {(c, k) for c in ct.CONFIGS for k in ct.CACHES}
    for row in rows:
        assert row["error"] is None, row
        assert row["model"] == "mlp" and row["process_s"] > 0 and row["compile_step_s"] > 0
        assert 0 < row["process_cpu_s"]
        assert row["kernels"] == row["kernels_forward"] + row["kernels_backward"]
        if row["cache"] == "cold":
            assert row["kernels_forward"] > 0 and row["kernels_backward"] > 0
        if row["config"] == "fxremat_default":
            assert isinstance(row["partition_s"], float) and row["fxremat_fallbacks"] == []
        else:
            assert row["partition_s"] is None
    checked = [r for r in rows if "grads_matched" in r]  # once per configuration, on its first cold run
    assert sorted(r["config"] for r in checked) == sorted(ct.CONFIGS)
    assert all(r["grads_matched"] and r["cache"] == "cold" for r in checked)
    assert [s["cache"] for s in record["summary"]] == ["cold", "warm"]
