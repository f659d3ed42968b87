"""benchmarks/gpu_check.py's recording and benchmarks/gpu_replay.py's replay: the dry run (tiny GPT-2, fp32, this
CPU, real Inductor) recorded into a temporary folder, then replayed: each rebuilt joint graph writes down as
recorded, the partitioner chooses the recorded plan again, the simulated peak is set beside the measured one and
the simulated kernels beside Inductor's.  Where a GPU run's recording is committed
(benchmarks/results/gpu_recordings/), the same checks run over it."""

import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_check  # noqa: E402
import gpu_recording  # noqa: E402
import gpu_replay  # noqa: E402

CONFIGS = ["pytorch_budget_0.5", "fxremat_default"]
# issue #57's bar for the simulator against a GPU's measured peak
PEAK_ERROR_BAR = 0.10


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("recording")
    out = tmp_path_factory.mktemp("out")
    code = gpu_check.main(["gpt2", "--dry-run", "--configs", *CONFIGS, "--out", str(out), "--record", str(folder)])
    return code, folder


@pytest.fixture(scope="module")
def replayed(recorded):
    return gpu_replay.replay_folder(recorded[1])


@pytest.mark.inductor
def test_the_dry_run_records_each_graph_with_inductors_kernels(recorded):
    code, folder = recorded
    assert code == 0  # every configuration compiled, its gradients equal to eager's
    files = gpu_recording.read_configs(folder)
    assert sorted(data["config"] for _, data in files) == sorted(CONFIGS)
    for path, data in files:
        assert len(path.relative_to(folder).parts) <= 2 and path.stat().st_size <= gpu_recording.FILE_LIMIT
        measured = data["measured"]
        assert measured["peak_bytes"] > 0 and measured["gradients"]["wrong_params"] == 0
        assert len(measured["step_s_per_repeat"]) == 2  # the dry run's repeats
        (graph,) = data["graphs"]
        assert (path.parent / graph["joint_file"]).is_file() and graph["plan"]["saved"]
        phases = sorted(s["backward"] for s in graph["schedules"])
        assert phases == [False, True]  # the forward's kernels, then the backward's
        kernels = [k for s in graph["schedules"] for k in s["kernels"] if k["kind"] != "NopKernelSchedulerNode"]
        assert kernels and all(k["origins"] for k in kernels)
    assert len({g["joint_file"] for _, d in files for g in d["graphs"]}) == 1  # one joint graph, written once
    assert gpu_recording.folder_bytes(folder) <= gpu_recording.TOTAL_LIMIT


@pytest.mark.inductor
def test_the_replay_rebuilds_each_graph_and_chooses_the_recorded_plan(recorded, replayed):
    assert {r["config"] for r in replayed} == set(CONFIGS) and not [r for r in replayed if "error" in r]
    for row in replayed:
        data = gpu_recording.read_gz(recorded[1] / "gpt2" / f"{row['config']}.json.gz")
        joint = gpu_recording.read_gz(recorded[1] / "gpt2" / data["graphs"][0]["joint_file"])
        assert row["joint_as_recorded"] and row["joint_nodes"] == len(joint["nodes"])
        assert row["plan_as_recorded"], row["plan_differences"]
        assert row["measured_peak_bytes"] == data["measured"]["peak_bytes"]
        assert math.isfinite(row["peak_error"])
        if row["partitioner"] == "fxremat":  # the replay's simulation is the recording machine's
            assert row["simulated_peak_bytes"] == row["recorded_simulated_peak_bytes"]
        for phase in ("forward", "backward"):
            kernels = row["schedules"][phase]
            assert kernels["recorded_kernels"] > 0 and kernels["simulated_kernels"] > 0
            assert 0 < kernels["kernels_same"] <= kernels["recorded_kernels"]
            assert 0 <= kernels["order_agreement"] <= 1
    assert "| gpt2 | fxremat_default | fxremat | yes |" in gpu_replay.table(replayed)


def test_a_snapshot_reduced_to_buffers_and_the_peak(tmp_path):
    generated = tmp_path / "cabc.py"
    generated.write_text("def call(args):\n    buf0 = empty_strided_cuda((4, 4), (4, 1), torch.float32)\n")
    frame = dict(filename=str(generated), line=2, name="call")
    events = [
        dict(action="segment_alloc", addr=0, size=2**20),
        dict(action="alloc", addr=100, size=64, frames=[frame]),
        dict(action="alloc", addr=200, size=32, frames=[dict(filename="train.py", line=9, name="step")]),
        dict(action="free_requested", addr=100, size=64),
        dict(action="free_completed", addr=100, size=64),
        dict(action="alloc", addr=100, size=16, frames=[frame]),
    ]
    reduced = gpu_recording.reduce_snapshot(dict(device_traces=[events]))
    assert reduced["events"] == [
        ["a", 0, 64, "buf0", 0],
        ["a", 1, 32, None, None],
        ["f", 0, 64, None, None],
        ["a", 0, 16, "buf0", 0],
    ]
    assert reduced["peak_bytes"] == 96 and reduced["modules"] == ["cabc.py"]


def _committed():
    folder = gpu_replay.DEFAULT_FOLDER
    return gpu_recording.read_configs(folder) if folder.is_dir() else []


@pytest.mark.skipif(not _committed(), reason="no GPU recording committed yet (benchmarks/results/gpu_recordings/)")
def test_committed_gpu_recordings_replay_with_their_plans():
    rows = gpu_replay.replay_folder(gpu_replay.DEFAULT_FOLDER)
    assert rows and not [r for r in rows if "error" in r]
    assert all(r["joint_as_recorded"] for r in rows)
    assert [r["config"] for r in rows if not r["plan_as_recorded"]] == []


@pytest.mark.skipif(not _committed(), reason="no GPU recording committed yet (benchmarks/results/gpu_recordings/)")
def test_committed_gpu_recordings_simulated_peaks_within_the_bar():
    rows = [r for r in gpu_replay.replay_folder(gpu_replay.DEFAULT_FOLDER) if r.get("peak_error") is not None]
    assert rows
    errors = {f"{r['model']}/{r['config']}": round(r["peak_error"], 3) for r in rows}
    wide = {name: error for name, error in errors.items() if abs(error) > PEAK_ERROR_BAR}
    assert not wide
