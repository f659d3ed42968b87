"""benchmarks/gpu_check.py: its table from a record, its refusal without a GPU, its models and configurations.  The
dry run itself (tiny shapes on the CPU, every model and configuration compiled and recorded) runs in .ci/run; a
smaller one runs in test_gpu_replay.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check  # noqa: E402


def _record(**row_overrides):
    grads = dict(wrong_params=0, worst_error=2e-6)
    row = dict(
        model="gpt2",
        config="fxremat_default",
        compile_s=12.3,
        peak_bytes=3 * 2**20,
        step_s=0.02,
        step_s_per_repeat=[0.019, 0.02, 0.021],
        items_per_s=1000.0,
        simulated_peak_bytes=int(3.3 * 2**20),
        sim_error=0.1,
        gradients=grads,
    )
    row.update(row_overrides)
    return dict(device_name="H100", torch="2.11", rows=[row], seconds=9, steps=20, repeats=3)


def test_the_table_shows_measured_and_simulated_peaks_the_repeats_and_the_gradient_verdict():
    text = gpu_check.markdown(_record())
    assert "| gpt2 | fxremat_default | 12.3 | 3.0 | 3.3 (+10.0%) | 20.0 (19.0 / 20.0 / 21.0) | 1,000 | equal" in text
    assert "not a compile-time comparison" in text  # the compiles share one process: the table says so
    wrong = gpu_check.markdown(_record(gradients=dict(wrong_params=2, worst_error=0.5)))
    assert "WRONG (2)" in wrong
    failed = gpu_check.markdown(dict(_record(), rows=[dict(model="llama", config="pytorch_default", error="OOM")]))
    assert "| llama | pytorch_default | failed: OOM |" in failed


def test_the_real_run_refuses_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--dry-run"):
        gpu_check.run_check(["gpt2"], dry_run=False, steps=1, repeats=1, configs=None, folder=None)


def test_the_models_their_shapes_and_configurations():
    assert set(gpu_check.SHAPES) == set(gpu_check.DRY_SHAPES) == set(gpu_check.MODELS) == {"gpt2", "llama", "resnet18"}
    for shapes in (gpu_check.SHAPES, gpu_check.DRY_SHAPES):
        assert shapes["llama"]["kv_heads"] < shapes["llama"]["heads"]
    assert gpu_check.SHAPES["llama"]["batch"] * gpu_check.SHAPES["llama"]["seq"] == 4 * 2048
    assert len(gpu_check.MODEL_CONFIGS["gpt2"]) == 4 and gpu_check.MODEL_CONFIGS["resnet18"] == gpu_check.CONV_CONFIGS


def test_unknown_models_are_refused_by_name():
    with pytest.raises(SystemExit):
        gpu_check.main(["vgg", "--dry-run"])


def test_the_llama_built_has_grouped_query_attention_and_the_same_weights_each_time():
    pytest.importorskip("transformers")
    model, loss, items = gpu_check.build("llama", gpu_check.DRY_SHAPES["llama"], gpu_check.torch.float32, "cpu")
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)
    assert model.config.intermediate_size == 176 and items == 32
    again, _, _ = gpu_check.build("llama", gpu_check.DRY_SHAPES["llama"], gpu_check.torch.float32, "cpu")
    assert again is not model
    assert all(gpu_check.torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # same weights
    assert loss(model).ndim == 0


def test_the_conv_net_is_resnet18_shaped():
    model, loss, items = gpu_check.build("resnet18", gpu_check.DRY_SHAPES["resnet18"], gpu_check.torch.float32, "cpu")
    convs = [m for m in model.modules() if isinstance(m, gpu_check.torch.nn.Conv2d)]
    assert len(convs) == 20 and items == 2  # the stem, 16 in blocks, 3 downsampling shortcuts
    assert loss(model).ndim == 0


def test_a_model_whose_budget_passes_the_time_limit_is_skipped_with_a_row_that_says_so(monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *device: "H100")
    record = gpu_check.run_check(["gpt2", "resnet18"], False, 20, 3, None, None, time_limit=50)
    assert [r["config"] for r in record["rows"]] == [*gpu_check.TRANSFORMER_CONFIGS, *gpu_check.CONV_CONFIGS]
    assert all(r["error"].startswith("skipped:") and "--time-limit 50" in r["error"] for r in record["rows"])
    assert sum(gpu_check.MODEL_SECONDS.values()) <= gpu_check.TIME_LIMIT - 10  # the full run fits by its estimate
