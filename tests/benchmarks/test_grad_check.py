"""benchmarks/grad_check.py without compiling: the wrong-parameter rule on hand-made numbers, the command line, the
bookkeeping and the table, and the eager half of a check (the fp64 copy, dropout detection) on the conv nets."""

import math

import grad_check as gc
import grad_rule
import pytest
import torch
from bench_models import Workload
from conv_models import build_conv_workload

# ---- the rule --------------------------------------------------------------------------------------------------


def test_a_parameter_is_wrong_past_the_tolerance_and_ten_times_eager_fp32():
    assert grad_rule.is_wrong(2e-3, 1e-4)  # past 1e-3 and 20x eager's own error
    assert not grad_rule.is_wrong(2e-3, 3e-4)  # eager fp32 is almost as far from fp64: rounding, not a mistake
    assert not grad_rule.is_wrong(9e-4, 0.0)  # within the tolerance, whatever eager does
    assert grad_rule.is_wrong(math.nan, 1e-7) and grad_rule.is_wrong(math.inf, 1e-7)


def test_errors_are_relative_to_the_fp64_gradient_and_a_missing_gradient_is_infinite():
    reference = {"w": torch.tensor([2.0, -4.0], dtype=torch.float64), "b": torch.tensor([1.0], dtype=torch.float64)}
    errors, near_zero = grad_rule.relative_errors({"w": torch.tensor([2.0, -3.0])}, reference)
    assert errors == {"w": 0.25, "b": math.inf} and near_zero == []


def test_a_gradient_that_is_zero_in_exact_arithmetic_is_measured_on_the_models_scale():
    reference = {"w": torch.ones(2, dtype=torch.float64), "key_bias": torch.full((2,), 1e-17, dtype=torch.float64)}
    errors, near_zero = grad_rule.relative_errors({"w": torch.ones(2), "key_bias": torch.full((2,), 1e-11)}, reference)
    assert near_zero == ["key_bias"] and errors["key_bias"] == pytest.approx(1e-11)


def test_judge_counts_wrong_parameters_and_names_the_worst():
    errors = {"a": 1e-6, "b": 0.5, "c": 2e-3, "d": 2e-3}
    eager = {"a": 1e-6, "b": 1e-6, "c": 1e-6, "d": 1e-3}  # d: eager fp32 is as wrong, so d is not
    verdict = grad_rule.judge(errors, eager)
    assert verdict["params"] == 4 and verdict["wrong_params"] == 2
    assert [w["name"] for w in verdict["wrong"]] == ["b", "c"]  # worst first
    assert (verdict["worst_param"], verdict["worst_error"]) == ("b", 0.5)
    assert (verdict["eager_worst_param"], verdict["eager_worst_error"]) == ("d", 1e-3)


def test_verdict_judges_the_loss_too_and_gives_none_for_a_dropout_model():
    g64 = {"w": torch.ones(3, dtype=torch.float64)}
    out = gc.verdict(1.1, {"w": torch.ones(3)}, 1.0, {"w": torch.ones(3)}, 1.0, g64)
    assert out["wrong_params"] == 0 and out["loss_wrong"] and out["loss_error"] == pytest.approx(0.1)
    skipped = gc.verdict(1.1, {"w": 2 * torch.ones(3)}, 1.0, {"w": torch.ones(3)}, 1.0, g64, skip=True)
    assert skipped["wrong_params"] is None and skipped["loss_wrong"] is None and skipped["worst_error"] == 1.0


# ---- command line and bookkeeping ------------------------------------------------------------------------------


def test_defaults_are_every_model_and_setting_and_subsets_keep_their_order():
    args = gc.parse_args([])
    assert args.models == list(gc.MODELS) and args.settings == list(gc.SETTINGS) and args.out is None
    assert len(gc.plan(args.models, args.settings)) == len(gc.MODELS) * len(gc.SETTINGS) == 20 * 9
    args = gc.parse_args(["--models", "unet", "mlp", "--settings", "pytorch_default", "fxremat_budget_0.5"])
    assert gc.plan(args.models, args.settings) == [
        ("unet", "fxremat_budget_0.5"), ("unet", "pytorch_default"),
        ("mlp", "fxremat_budget_0.5"), ("mlp", "pytorch_default"),
    ]


def test_eight_fxremat_settings_gate_and_pytorch_default_does_not():
    assert [s for s in gc.SETTINGS if gc.gates(s)] == [
        "fxremat_default", "fxremat_budget_1.0", "fxremat_budget_0.5", "fxremat_budget_0.2", "fxremat_budget_0.0",
        "fxremat_peak_0.5", "fxremat_peak_0.0", "fxremat_loss_chunks_4",
    ]
    assert gc.SETTINGS["pytorch_default"] is None and gc.SETTINGS["fxremat_peak_0.0"] == dict(peak_budget=0.0)


@pytest.mark.parametrize("argv", [["--models", "nope"], ["--settings", "fxremat_budget_0.3"]])
def test_unknown_names_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        gc.parse_args(argv)
    assert exit_.value.code == 2 and "choose from" in capsys.readouterr().err


def test_list_names_every_model_and_setting(capsys):
    assert gc.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in (*gc.MODELS, *gc.SETTINGS))
    assert "no (reported beside)" in out and "memory_budget=0.2" in out


def _row(model, setting, n_wrong=0, **extra):
    return dict(model=model, setting=setting, gates=gc.gates(setting), status="ok", error=None, params=4,
                wrong_params=n_wrong, worst_error=0.5 if n_wrong else 1e-7, worst_param="fc.weight",
                eager_worst_error=1e-7, loss_error=1e-8, loss_wrong=False, compile_step_s=12.5, **extra)


def test_only_gating_rows_fail_and_the_table_shows_every_row():
    rows = [_row("m", "fxremat_default"), _row("m", "fxremat_budget_0.5", n_wrong=3),
            _row("m", "pytorch_default", n_wrong=1), gc.error_row("n", "fxremat_peak_0.0", "RuntimeError: boom\nmore")]
    assert [gc.failed(r) for r in rows] == [False, True, False, True]
    text = gc.table(rows)
    assert len(text.splitlines()) == 2 + len(rows)
    assert "3/4" in text and "FAIL" in text and "RuntimeError: boom" in text
    assert [line.split()[2] for line in text.splitlines()[2:]] == ["ok", "FAIL", "wrong", "error"]
    assert "not gating" in text.splitlines()[4]
    assert gc.summary(rows) == ("3 gating runs: 1 ok, 0 skipped (dropout), "
                                "2 FAILED: m/fxremat_budget_0.5 n/fxremat_peak_0.0")


def test_wrong_parameters_are_cross_referenced_with_pytorch_defaults_row():
    def wrong(*names):
        return [dict(name=n, error=1.0, eager_error=1e-6) for n in names]

    rows = gc.cross_reference([_row("m", "fxremat_default", n_wrong=2, wrong=wrong("a", "b")),
                               _row("m", "pytorch_default", n_wrong=1, wrong=wrong("b")),
                               _row("n", "fxremat_peak_0.0", n_wrong=1, wrong=wrong("a"))])
    assert rows[0]["also_wrong_in_pytorch_default"] == 1 and "1 also wrong under pytorch_default" in gc.note(rows[0])
    assert rows[2]["also_wrong_in_pytorch_default"] is None  # model n has no pytorch_default row
    assert "also_wrong_in_pytorch_default" not in rows[1] and gc.failed(rows[0])  # it still gates


def test_a_failing_run_becomes_an_error_row_and_the_others_go_on(capsys):
    def runner(model, setting, timeout):
        if model == "bad":
            raise RuntimeError("boom")
        return _row(model, setting)

    saved = []
    rows = gc.run_all([("bad", "fxremat_default"), ("good", "fxremat_default")], runner, on_row=saved.append)
    assert rows[0]["status"] == "error" and rows[0]["error"] == "RuntimeError: boom" and rows[1]["status"] == "ok"
    assert len(saved) == 2  # the JSON is rewritten after every run
    assert "[2/2] good / fxremat_default" in capsys.readouterr().err


def test_worker_output_is_the_last_marked_line():
    stdout = f'noise\n{gc.ROW_MARKER}{{"a": 1}}\nmore noise\n{gc.ROW_MARKER}{{"a": 2}}\n'
    assert gc.parse_worker_output(stdout) == {"a": 2} and gc.parse_worker_output("nothing") is None


# ---- the eager half of a check ---------------------------------------------------------------------------------


def test_the_fp64_copy_casts_floating_inputs_only_and_leaves_the_original_alone():
    model = torch.nn.Embedding(10, 4)
    work = Workload(model, args=(torch.tensor([1, 2]),), kwargs=dict(scale=torch.ones(2)))
    double = gc.copy_workload(work, double=True)
    assert double.model.weight.dtype == torch.float64 and model.weight.dtype == torch.float32
    assert double.args[0].dtype == torch.int64 and double.kwargs["scale"].dtype == torch.float64


@pytest.mark.parametrize("name", ["resnet_gn20", "resnet", "mobilenet", "convnext"])
def test_eager_fp32_passes_the_rule_against_fp64_on_the_conv_nets(name):
    work = build_conv_workload(name)
    reference, eager = gc.copy_workload(work, double=True), gc.copy_workload(work)
    assert not gc.dropout_active(work)
    loss64, grads64 = gc.train_step(reference, reference.model)
    loss32, grads32 = gc.train_step(eager, eager.model)
    loss, grads = gc.train_step(work, work.model)  # stands in for the compiled model: same weights, same state
    out = gc.verdict(loss, grads, loss32, grads32, loss64, grads64)
    assert out["wrong_params"] == 0 and not out["loss_wrong"] and out["params"] == len(grads64)
    # eager fp32 itself is not exact: 0.6% off fp64 on MobileNet's expansion BatchNorm weights (conv_models.py)
    assert out["worst_error"] == out["eager_worst_error"] < 1e-2


def test_dropout_is_detected():
    work = Workload(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)), args=(torch.randn(8, 4),))
    assert gc.dropout_active(work)
    work.model[1].p = 0.0
    assert not gc.dropout_active(work)
    dropped_loss = lambda out: torch.dropout(out, 0.5, True).sum()  # noqa: E731
    functional = Workload(torch.nn.Linear(4, 4), args=(torch.randn(8, 4),), loss=dropped_loss)
    assert gc.dropout_active(functional)  # no Dropout module: found by two seeds disagreeing
