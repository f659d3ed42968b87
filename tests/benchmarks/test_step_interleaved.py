"""benchmarks/step_interleaved.py: the interleaving, the ratios and the table on literal rows (no compiling); the
whole script once on the tiny MLP with real Inductor."""

import json

import bench_measure as bm
import pytest
import step_interleaved as si


def test_round_robin_gives_every_configuration_once_per_round_starting_in_turn():
    order = list(si.round_robin(["a", "b", "c"], 4))
    assert [c for _, c in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [i for i, _ in order] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_configurations_expand_and_run_in_run_py_order():
    args = si.parse_args(
        ["--model", "mlp", "--configs", "fxremat_at_pytorch_0.2", "pytorch_budget_0.2", "pytorch_default"]
    )
    assert args.configs == ["pytorch_default", "pytorch_budget_0.2", "fxremat_at_pytorch_0.2"]
    args = si.parse_args(["--model", "llama_stack", "--configs", "issue15"])
    assert args.configs == [c for c in bm.CONFIGS if c in bm.ISSUE15_CONFIGS] and args.steps >= 20
    with pytest.raises(SystemExit):
        si.parse_args(["--model", "mlp", "--configs", "fxremat_default"])  # the reference is not among them
    with pytest.raises(SystemExit):
        si.parse_args(["--model", "mlp", "--configs", "pytorch_default", "no_such_config"])


def _row(per_repetition, **extra):
    return dict(error=None, step_ms_per_repetition=per_repetition, saved_bytes=2**20, grads_matched=True, **extra)


def test_ratios_are_taken_per_repetition_against_the_reference_and_the_same_setting():
    rows = {
        "pytorch_default": _row([10.0, 10.0, 20.0]),
        "pytorch_budget_0.5": _row([12.0, 12.0, 12.0]),
        "fxremat_budget_0.5": _row([12.0, 13.2, 12.6]),
        "fxremat_peak_0.0": _row([11.0, 11.0, 11.0]),
        "fxremat_at_pytorch_0.2": dict(error="needs a successful pytorch_budget_0.2 run"),
    }
    si.add_step_ratios(rows, "pytorch_default")
    budget = rows["fxremat_budget_0.5"]
    assert budget["step_ratio_per_repetition"] == pytest.approx([1.2, 1.32, 0.63])
    assert budget["step_ratio"] == pytest.approx(1.2)
    assert budget["step_ratio_same_setting_per_repetition"] == pytest.approx([1.0, 1.1, 1.05])
    assert budget["step_ratio_same_setting"] == pytest.approx(1.05)
    assert budget["same_setting_as"] == "pytorch_budget_0.5"
    assert rows["fxremat_peak_0.0"]["step_ratio_same_setting"] is None  # no PyTorch knob of its kind
    assert rows["fxremat_at_pytorch_0.2"]["step_ratio"] is None
    lines = si.table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and all(line.count("|") == len(si.HEADERS) + 1 for line in lines)
    assert "| 1.050x (1.000 / 1.100 / 1.050) vs pytorch_budget_0.5 |" in lines[4]


def test_timing_interleaves_steps_with_the_collector_off():
    import gc

    import torch
    from bench_models import Workload

    seen = []

    def entry(name):
        model = torch.nn.Linear(4, 4)

        def step(x):
            seen.append((name, gc.isenabled()))
            return model(x)

        return dict(work=Workload(model, args=(torch.randn(2, 4),)), compiled=step, row=dict(error=None))

    entries = {"a": entry("a"), "b": entry("b"), "failed": dict(row=dict(error="boom"))}
    si.time_interleaved(entries, steps=3, repetitions=2, device="cpu")
    timed = seen[2 * bm.WARMUP_STEPS :]
    assert [name for name, _ in timed] == ["a", "b", "b", "a", "a", "b"] * 2
    assert not any(enabled for _, enabled in timed) and gc.isenabled()
    for name in ("a", "b"):
        row = entries[name]["row"]
        assert [len(rep) for rep in row["step_times_ms"]] == [3, 3] and len(row["step_ms_per_repetition"]) == 2
    assert "step_ms" not in entries["failed"]["row"]


@pytest.mark.inductor
def test_the_script_on_the_tiny_mlp(tmp_path):
    out = tmp_path / "steps.json"
    assert (
        si.main(
            [
                "--model",
                "mlp",
                "--size",
                "tiny",
                "--configs",
                "pytorch_budget_0.5",
                "pytorch_budget_0.0",  # a second PyTorch budget in the same process compiles its own graph
                "fxremat_at_pytorch_0.5",
                "--reference",
                "pytorch_budget_0.5",
                "--steps",
                "2",
                "--repetitions",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    pytorch, pytorch_zero, fxremat = json.loads(out.read_text())["rows"]
    assert pytorch_zero["saved_bytes"] < pytorch["saved_bytes"]
    for row in (pytorch, pytorch_zero, fxremat):
        assert row["error"] is None and row["grads_matched"] is True and row["graphs"] == 1
        assert [len(rep) for rep in row["step_times_ms"]] == [2, 2]
    assert fxremat["memory_budget_bytes"] == pytorch["saved_bytes"]
    assert pytorch["step_ratio"] == 1.0 and fxremat["same_setting_as"] == "pytorch_budget_0.5"
