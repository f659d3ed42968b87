"""benchmarks/run.py end to end, as a user runs it: the JSON's structure and that gradients matched eager.
Times are never asserted (this machine is shared and noisy), only that they are there and positive."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
ENVIRONMENT_KEYS = {"date", "command_line", "torch", "cpu", "gpu", "threads", "python", "fxremat"}


def _run(tmp_path, *args, timeout=300):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run([sys.executable, str(RUN), *args, "--json", str(tmp_path / "r.json"),
                             "--markdown", str(tmp_path / "r.md")],
                            env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((tmp_path / "r.json").read_text()), (tmp_path / "r.md").read_text()


def _assert_measured(row):
    assert row["error"] is None, row
    assert isinstance(row["saved_bytes"], int) and row["saved_bytes"] > 0
    assert isinstance(row["saved_tensors"], int) and row["saved_tensors"] > 0
    assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] > 0
    assert row["peak_method"] in ("cpu_profiler_memory_events", "cuda_max_memory_allocated")
    assert isinstance(row["step_ms"], float) and row["step_ms"] > 0
    assert isinstance(row["compile_s"], float) and row["compile_s"] > 0
    assert row["grads_matched"] is True and row["max_grad_error"] < 1e-3
    assert row["near_zero_grad_params"] == []  # the MLP has no parameter whose gradient is zero
    assert row["graphs"] == 1
    for ratio in ("saved_ratio", "peak_ratio", "step_ratio"):
        assert ratio in row


@pytest.mark.inductor
def test_quick(tmp_path):
    result, markdown = _run(tmp_path, "--quick")
    assert ENVIRONMENT_KEYS <= set(result["environment"])
    assert result["environment"]["threads"] == 1
    assert result["settings"]["quick"] is True
    rows = {row["config"]: row for row in result["rows"]}
    assert set(rows) == {"pytorch_default", "fxremat_default"}
    for row in rows.values():
        assert row["model"] == "mlp"
        _assert_measured(row)
    assert rows["pytorch_default"]["partition_s"] is None
    assert isinstance(rows["fxremat_default"]["partition_s"], float)
    assert rows["fxremat_default"]["fxremat_fallbacks"] == []
    assert rows["pytorch_default"]["saved_ratio"] == 1.0
    assert markdown.count("| mlp |") == 2


@pytest.mark.inductor
def test_worker_processes_pass_pytorch_budget_bytes_to_fxremat(tmp_path):
    """The full path: one fresh worker process per configuration, and fxremat_at_pytorch_0.5 gets, as an absolute
    budget, exactly the saved bytes pytorch_budget_0.5 measured."""
    result, _ = _run(tmp_path, "--models", "mlp", "--size", "tiny", "--repeats", "1",
                     "--configs", "pytorch_budget_0.5", "fxremat_at_pytorch_0.5")
    pytorch, fxremat = result["rows"]
    assert (pytorch["config"], fxremat["config"]) == ("pytorch_budget_0.5", "fxremat_at_pytorch_0.5")
    _assert_measured(pytorch)
    _assert_measured(fxremat)
    assert fxremat["memory_budget_bytes"] == pytorch["saved_bytes"]
    assert fxremat["fxremat_fallbacks"] == []


def test_reused_pytorch_rows_are_not_run_again_and_feed_the_equal_bytes_budget():
    """--reuse-pytorch: a PyTorch row of an earlier run is taken as it is (and marked); fxremat_at_pytorch_X gets
    its saved bytes as a budget; every other configuration still runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import run

    earlier = [dict(model="mlp", config="pytorch_budget_0.5", size="tiny", saved_bytes=1234, error=None)]
    calls = []

    def runner(model, config, budget):
        calls.append((config, budget))
        return dict(model=model, config=config, size="tiny", saved_bytes=0, error=None)

    runs = [("mlp", "pytorch_budget_0.5"), ("mlp", "fxremat_at_pytorch_0.5"), ("mlp", "pytorch_default")]
    rows = run.run_all(runs, runner, "tiny", reused=earlier)
    assert calls == [("fxremat_at_pytorch_0.5", 1234), ("pytorch_default", None)]
    assert rows[0]["reused_from"] == "--reuse-pytorch" and rows[0]["saved_bytes"] == 1234
