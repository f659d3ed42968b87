"""benchmarks/gpu_check.py: its table from a record, and its refusal without a GPU.  The dry run itself (tiny
shapes on the CPU, every configuration compiled) runs in .ci/run, not here: it is minutes of Inductor compiles."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check  # noqa: E402


def _record(**row_overrides):
    row = dict(
        config="fxremat_default",
        compile_s=12.3,
        peak_bytes=3 * 2**20,
        step_s=0.02,
        step_s_spread=[0.019, 0.021],
        tokens_per_s=1000.0,
        simulated_peak_bytes=int(3.3 * 2**20),
        sim_error=0.1,
    )
    row.update(row_overrides)
    grads = dict(config="fxremat_default", shape="s", max_error=2e-6, worst_parameter="w", ok=True)
    return dict(model="gpt2", shape="batch 8", device_name="H200", torch="2.11", rows=[row], gradients=grads, seconds=9)


def test_the_table_shows_measured_and_simulated_peaks_and_the_gradient_verdict():
    text = gpu_check.markdown(_record())
    assert "| fxremat_default | 12.3 | 3.0 | 3.3 (+10.0%) | 20.0 (19.0-21.0) | 1,000 |" in text
    assert "equal to eager" in text
    assert "not a compile-time comparison" in text  # the compiles share one process: the table says so
    failed = gpu_check.markdown(dict(_record(), rows=[dict(config="pytorch_default", error="OOM")]))
    assert "| pytorch_default | failed: OOM |" in failed


def test_the_real_run_refuses_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--dry-run"):
        gpu_check.run_check("gpt2", dry_run=False, steps=1, configs=["pytorch_default"])


def test_both_models_have_a_full_and_a_dry_run_shape_with_grouped_query_attention_for_llama():
    assert set(gpu_check.SHAPES) == set(gpu_check.DRY_SHAPES) == {"gpt2", "llama"}
    for shapes in (gpu_check.SHAPES, gpu_check.DRY_SHAPES):
        assert shapes["llama"]["kv_heads"] < shapes["llama"]["heads"]
    assert gpu_check.SHAPES["llama"]["batch"] * gpu_check.SHAPES["llama"]["seq"] == 4 * 2048


def test_the_llama_built_has_grouped_query_attention_and_the_ffn_width_asked_for():
    pytest.importorskip("transformers")
    model, ids = gpu_check.build("llama", gpu_check.DRY_SHAPES["llama"], gpu_check.torch.float32, "cpu")
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)
    assert model.config.intermediate_size == 176 and tuple(ids.shape) == (1, 32)
    again, _ = gpu_check.build("llama", gpu_check.DRY_SHAPES["llama"], gpu_check.torch.float32, "cpu")
    assert all(gpu_check.torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # same weights
