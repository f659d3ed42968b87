"""Turning measured rows into outputs: ratios against PyTorch's default, the environment block, the Markdown table,
the JSON file and the plot.  Rows come in as plain dicts (one per model x configuration) and are never re-measured.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

MIB = 2**20
BASELINE = "pytorch_default"
# (row key, ratio key): each row's figure divided by the same model's pytorch_default figure.
RATIOS = (("saved_bytes", "saved_ratio"), ("peak_bytes", "peak_ratio"), ("step_ms", "step_ratio"))


# ---- data ------------------------------------------------------------------------------------------------------


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``saved_ratio``, ``peak_ratio``, ``step_ratio`` against its model's pytorch_default row
    (None where either side is missing or failed, or the baseline is 0)."""
    baselines = {r["model"]: r for r in rows if r["config"] == BASELINE and not r.get("error")}
    out = []
    for row in rows:
        base = baselines.get(row["model"])
        row = dict(row)
        for key, ratio in RATIOS:
            row[ratio] = _ratio(row.get(key), None if base is None else base.get(key))
        out.append(row)
    return out


def _ratio(value, base) -> float | None:
    if value is None or not base:
        return None
    return value / base


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a missing or broken optional package is just "not there"
        return None


def environment(threads: int) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command_line=[sys.executable, *sys.argv],
        torch=torch.__version__,
        cuda=torch.version.cuda if cuda else None,
        gpu=torch.cuda.get_device_name(0) if cuda else None,
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        threads=threads,
        python=platform.python_version(),
        platform=platform.platform(),
        fxremat=_version("fxremat"),
        transformers=_version("transformers"),
        git_commit=git_commit(),
        # the machine's load when the run began: a timing is only worth comparing on a quiet machine, and the
        # results page states the load beside every table
        load_avg_1min=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,  # not on Windows
    )


# ---- Markdown --------------------------------------------------------------------------------------------------

HEADERS = (
    "model",
    "config",
    "saved MiB",
    "peak MiB",
    "sim peak MiB",
    "sim err",
    "step ms",
    "compile s",
    "partition s",
    "grads ok",
    "saved vs default",
    "peak vs default",
    "step vs default",
    "note",
)


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "" if value is None else format(value / scale, spec)


def _fmt_error(value) -> str:
    return "" if value is None else f"{value:+.1%}"


def _fmt_ratio(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def _fmt_grads(row) -> str:
    matched = row.get("grads_matched")
    if matched is None:
        return "" if row.get("error") else "n/a"
    return "yes" if matched else f"NO ({row.get('max_grad_error', float('nan')):.1e})"


def compile_notes(row: dict[str, Any]) -> list[str]:
    """Graph breaks, fxremat's fallbacks and missed budgets of a compiled run (``bench_measure.fxremat_facts``)."""
    notes = []
    if row.get("graphs", 1) > 1:
        notes.append(f"{row['graphs']} graphs")
    if row.get("fxremat_fallbacks"):
        notes.append(f"fxremat fell back on {len(row['fxremat_fallbacks'])} graph(s)")
    if False in (row.get("fxremat_budget_met") or []):
        notes.append("budget not met")
    return notes


def row_note(row: dict[str, Any]) -> str:
    """What a reader must know to trust the row: an error, a fallback, a missed budget, graph breaks."""
    if row.get("error"):
        return "error: " + row["error"].splitlines()[0][:100]
    notes = compile_notes(row)
    if row.get("memory_budget_bytes") is not None:
        notes.append(f"budget {row['memory_budget_bytes'] / MIB:.2f} MiB")
    if row.get("sim_note"):
        notes.append(row["sim_note"])
    return "; ".join(notes)


def table_cells(row: dict[str, Any]) -> list[str]:
    return [
        row["model"],
        row["config"],
        _fmt(row.get("saved_bytes"), ".2f", MIB),
        _fmt(row.get("peak_bytes"), ".2f", MIB),
        _fmt(row.get("simulated_peak_bytes"), ".2f", MIB),
        _fmt_error(row.get("sim_error")),
        _fmt(row.get("step_ms"), ".2f"),
        _fmt(row.get("compile_s"), ".1f"),
        _fmt(row.get("partition_s"), ".3f"),
        _fmt_grads(row),
        _fmt_ratio(row.get("saved_ratio")),
        _fmt_ratio(row.get("peak_ratio")),
        _fmt_ratio(row.get("step_ratio")),
        row_note(row).replace("|", "/"),
    ]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def markdown_document(result: dict[str, Any]) -> str:
    env, settings = result["environment"], result["settings"]
    device = env["gpu"] or env["cpu"] or "unknown CPU"
    header = (
        f"fxremat benchmark, size `{settings['size']}`, median of {settings['repeats']} steps after "
        f"{settings['warmup']} warm-up, {env['threads']} thread(s), {device}, torch {env['torch']}, "
        f"{env['date']}.\n\n"
    )
    return header + markdown_table(result["rows"])


# ---- files -----------------------------------------------------------------------------------------------------


def write_json(path: str, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")


def write_markdown(path: str, result: dict[str, Any]) -> None:
    Path(path).write_text(markdown_document(result))


def write_plot(path: str, rows: list[dict[str, Any]]) -> bool:
    """Peak memory against step time, one panel per model, one marker per configuration.  False (and no file)
    when matplotlib is not installed: the plot is optional."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if not r.get("error") and r.get("peak_bytes") is not None]
    models = list(dict.fromkeys(r["model"] for r in ok))
    if not models:
        return False
    configs = list(dict.fromkeys(r["config"] for r in ok))
    markers = dict(zip(configs, "os^vD*Pxh<>"))
    columns = min(3, len(models))
    rows_n = -(-len(models) // columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(4.5 * columns, 3.6 * rows_n), squeeze=False)
    for ax, model in zip(axes.flat, models):
        for r in (r for r in ok if r["model"] == model):
            ax.scatter(r["step_ms"], r["peak_bytes"] / MIB, marker=markers[r["config"]], label=r["config"], s=50)
        ax.set_title(model)
        ax.set_xlabel("step time (ms, median)")
        ax.set_ylabel("peak memory of a step (MiB)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    legend = {}  # every configuration once, whichever panel has it (a failed run leaves a panel without it)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 6), fontsize="small")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
