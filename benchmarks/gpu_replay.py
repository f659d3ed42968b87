"""The GPU check's recording replayed on any machine (issue #57: GPU evidence recorded once, replayed anywhere).

    python benchmarks/gpu_replay.py [FOLDER] [--models gpt2 ...] [--configs NAME ...] [--json OUT]

``FOLDER``: a recording of ``gpu_check.py`` (default ``benchmarks/results/gpu_recordings``).  Per model and
configuration, per recorded joint graph (``fxremat/replay.py``): the graph rebuilt with fake tensors on its
recorded device (CUDA metadata on a machine without a GPU) and checked to write down as recorded; partitioned
again by the partitioner that ran there (fxremat with the recorded options, device profile and simulator inputs,
or PyTorch's at the recorded budget) under the recorded Inductor and functorch config; then printed: whether the
plan is the recorded one, the simulated step peak against the measured peak (error), and the simulated kernels
against Inductor's recorded ones (kernels alike, order kept).  Replay on the recording's torch release for a
faithful plan (the rules of its Inductor are used either way; the op tables follow the running torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_recording  # noqa: E402

DEFAULT_FOLDER = Path(__file__).resolve().parent / "results" / "gpu_recordings"


def replay_config(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """One configuration file replayed: a row per recorded joint graph, with the measured peak beside the
    simulated one where the step had that one graph (``peak_error``: simulated / measured - 1)."""
    from fxremat.replay import replay_graph

    measured = data["measured"]
    graphs = [g for g in data["graphs"] if g.get("joint_file")]
    rows = []
    for entry in graphs:
        joint = gpu_recording.read_gz(path.parent / entry["joint_file"])
        row = dict(model=data["model"], config=data["config"], **replay_graph(entry, joint))
        one_graph = len(data["graphs"]) == 1 and measured.get("graphs") == 1
        peak = measured.get("peak_bytes")
        row["measured_peak_bytes"] = peak if one_graph else None
        row["peak_error"] = row["simulated_peak_bytes"] / peak - 1 if one_graph and peak else None
        rows.append(row)
    skipped = [g.get("unrecorded") for g in data["graphs"] if not g.get("joint_file")]
    if skipped:
        rows.append(dict(model=data["model"], config=data["config"], error=f"not recorded: {skipped}"))
    return rows


def replay_folder(folder: Path, models=None, configs=None) -> list[dict[str, Any]]:
    rows = []
    for path, data in gpu_recording.read_configs(folder):
        if (models and data["model"] not in models) or (configs and data["config"] not in configs):
            continue
        try:
            rows += replay_config(path, data)
        except Exception as error:  # noqa: BLE001 - one failing file must not cost the others their rows
            rows.append(dict(model=data["model"], config=data["config"], error=f"{type(error).__name__}: {error}"))
    return rows


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _kernels(phase: dict | None) -> str:
    if phase is None:
        return "not recorded"
    return (
        f"{phase['kernels_same']}/{phase['recorded_kernels']} recorded kernels alike "
        f"(simulated {phase['simulated_kernels']}), order {_share(phase['order_agreement'])}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | configuration | partitioner | plan as recorded | simulated MiB | measured MiB | error | "
        "forward kernels | backward kernels |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['config']} | failed: {row['error'][:200]} | | | | | | |")
            continue
        measured = row["measured_peak_bytes"]
        error = "-" if row["peak_error"] is None else f"{row['peak_error']:+.1%}"
        lines.append(
            f"| {row['model']} | {row['config']} | {row['partitioner']} | {'yes' if row['plan_as_recorded'] else 'NO'}"
            f" | {row['simulated_peak_bytes'] / 2**20:,.2f} | {'-' if measured is None else f'{measured / 2**20:,.2f}'}"
            f" | {error} | {_kernels(row['schedules']['forward'])} | {_kernels(row['schedules']['backward'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=str(DEFAULT_FOLDER))
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--configs", nargs="+", default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir() or not gpu_recording.read_configs(folder):
        print(f"gpu_replay.py: no recording in {folder} (benchmarks/gpu_check.py writes one on a GPU machine)")
        return 2
    rows = replay_folder(folder, args.models, args.configs)
    print(table(rows), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if any("error" in r or not r["plan_as_recorded"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
