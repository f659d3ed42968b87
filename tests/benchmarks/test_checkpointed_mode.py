"""benchmarks/run.py --checkpointed (issue #22): every model's blocks under torch.utils.checkpoint, compared with
the same model in eager.  No Inductor here: the wrapping, the eager row and the command line."""

from __future__ import annotations

import bench_measure as bm
import pytest
import run as bench_run
import torch
from bench_models import Checkpointed, build_workload


def test_example_blocks_are_wrapped_and_compute_the_same():
    plain = build_workload("stack", "tiny")
    work = build_workload("stack", "tiny", checkpointed=True)
    assert work.info["checkpointed"] == "2 blocks"
    assert all(isinstance(block, Checkpointed) for block in work.model.blocks)
    torch.testing.assert_close(work.forward(work.model), plain.forward(plain.model))


def test_a_single_block_model_is_wrapped_whole_and_transformers_use_their_switch():
    assert (
        build_workload("block_sdpa", "tiny", checkpointed=True).info["checkpointed"] == "the whole model as one block"
    )
    pytest.importorskip("transformers")  # the benchmark extra; CI installs only the test extra
    gpt2 = build_workload("gpt2", "tiny", checkpointed=True)
    assert gpt2.info["checkpointed"].startswith("transformers")
    assert getattr(gpt2.model, "is_activation_checkpointing", None) or gpt2.model.is_gradient_checkpointing


def test_eager_row_measures_the_uncompiled_checkpointed_step():
    row = bm.measure("stack", "tiny", bm.EAGER, 1, "cpu", checkpointed=True)
    assert row["error"] is None and row["checkpointed"] is True
    assert row["graphs"] == 0 and row["partition_s"] is None
    assert row["grads_matched"] is True
    # checkpoint keeps only each block's input: less than the same model without it
    unwrapped = bm.measure("stack", "tiny", bm.EAGER, 1, "cpu")
    assert 0 < row["saved_bytes"] < unwrapped["saved_bytes"]


def test_command_line_defaults_to_eager_inductor_and_fxremat():
    args = bench_run.parse_args(["--checkpointed", "--models", "stack"])
    assert args.checkpointed and args.configs == list(bm.CHECKPOINTED_CONFIGS)
    assert "--checkpointed" in bench_run.worker_command("stack", "eager", "tiny", 1, None, checkpointed=True)
