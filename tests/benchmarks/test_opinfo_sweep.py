"""benchmarks/opinfo_sweep.py on a few OpInfo ops (issue #23): fxremat's partitioner runs (strict) inside
PyTorch's ``aot_autograd_check``, and no op fails under it that PyTorch's partitioner passes."""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (pip install expecttest)")

import opinfo_sweep  # noqa: E402


def test_a_few_ops_pass_under_fxremat_as_under_pytorch():
    before = len(opinfo_sweep.REPORTS)
    results = opinfo_sweep.run(["sin", "mm", "var_mean", "split"], max_samples=1, dynamic_modes=(False, True))
    assert len(results) >= 8, [r.op for r in results]
    assert len(opinfo_sweep.REPORTS) > before  # our partitioner, not PyTorch's, ran the check
    assert not [r for r in results if r.fxremat_error is not None], opinfo_sweep.summary(results, 0.0)


def test_an_unknown_op_is_refused():
    with pytest.raises(SystemExit):
        opinfo_sweep.main(["--ops", "no_such_op"])


def test_dynamic_only_writes_each_row_as_it_is_done(tmp_path, capsys):
    import json

    progress = tmp_path / "rows.jsonl"
    assert opinfo_sweep.main(["--ops", "sin", "--dynamic", "--max-samples", "1", "--progress", str(progress)]) == 0
    rows = [json.loads(line) for line in progress.read_text().splitlines()]
    assert rows and all(r["dynamic"] and r["fxremat_error"] is None for r in rows)
    assert "1 pass under fxremat" in capsys.readouterr().out
