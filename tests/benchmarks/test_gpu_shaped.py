"""benchmarks/gpu_shaped.py at test sizes (the same GPT-2 and Llama structures, two blocks each): the graphs a GPU
would hand fxremat, with cuda metadata and the ``h100`` profile.  The default recomputes no matmul-class kernel and
its estimated extra time is a negligible share of the step (docs/DESIGN.md §4.5); a budget may still recompute
them.  The full sizes run from the command line (``python benchmarks/gpu_shaped.py``)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_shaped  # noqa: E402

# the default's estimated extra time, at most this share of the step's estimate (issue #57)
NEGLIGIBLE_SHARE = 0.01


@pytest.mark.parametrize("decompose", [True, False], ids=["inductor_decompositions", "plain"])
@pytest.mark.parametrize("name", gpu_shaped.MODELS)
def test_default_recomputes_no_matmul_at_gpu_shapes(name, decompose):
    reports, _ = gpu_shaped.partition(name, small=True, decompose=decompose)
    assert len(reports) == 1 and reports[0].fallback_reason is None
    report = reports[0]
    assert report.device_profile == "h100"
    assert gpu_shaped.compute_bound_recomputes(report.recomputed) == (0, 0)
    assert 0 < report.est_recompute_seconds <= NEGLIGIBLE_SHARE * report.est_step_seconds


def test_a_budget_may_still_recompute_matmuls():
    reports, _ = gpu_shaped.partition("gpt2", options=dict(memory_budget=0.0), small=True)
    count, flops = gpu_shaped.compute_bound_recomputes(reports[0].recomputed)
    assert count > 0 and flops > 0


def test_pytorchs_partitioner_runs_on_the_same_graph():
    reports, seconds = gpu_shaped.partition("llama", partitioner="pytorch_0.5", small=True)
    assert len(reports) == 1 and reports[0].saved_bytes > 0 and seconds > 0
