"""Issue #15's table from ``benchmarks/run.py`` results: per model and setting, saved bytes, measured peak and step
time under both partitioners, fxremat's simulated peak, and the checks of the issue's "done when" flagged.

    python benchmarks/run.py --size small --repeats 5 --configs issue15 --json results.json \\
        --models mlp block_sdpa stack convnet gpt2 llama bert t5 vit mixtral llama_stack
    python benchmarks/peak_table.py results.json [more.json ...] [--steps steps_*.json] [--markdown PATH] [--strict]

Several files are read as one set of rows (a later row of the same model and configuration replaces an earlier
one), so a model run on its own joins the table.  The flags, per model (a row that failed, or is missing, is
left out of every check that needs it):

    (a) fxremat's measured peak rises by more than 3% as memory_budget goes 1.0 -> 0.5 -> 0.2 (against every looser
        setting measured, so 1.0 -> 0.2 counts too)
    (b) fxremat at memory_budget 0.0 measures a higher peak than PyTorch at 0.0
    (c) at 0.5 and 0.2: fxremat's peak above PyTorch's at the same setting, or fxremat at PyTorch's measured saved
        bytes (fxremat_at_pytorch_X) above PyTorch at X
    (d) peak_budget=0.0 is not the lowest measured peak of the model's rows (both partitioners) within 3%
    (e) |simulated / measured - 1| > 10% on an fxremat row
    (f) gradients not matched against eager; (x) a row that failed
    (g) with --steps (benchmarks/step_interleaved.py JSON files): fxremat's interleaved median step time above
        1.05x PyTorch's at the same setting (the median of the per-repetition ratios)

The thresholds are the issue's.  The "step ms" columns are run.py's medians, one configuration per process; the
issue's step-time criterion is the interleaved ratio of step_interleaved.py (``--steps``).  Exit status 0, or 1
with --strict when anything is flagged.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 2**20
MONOTONE_SLACK = 0.03  # issue #15: "measured peak non-increasing (within 3%)"
LOWEST_SLACK = 0.03  # issue #15: peak_budget=0.0 "the lowest of all settings (within 3%)"
SIM_TOLERANCE = 0.10  # issue #15: "simulated within 10% of measured"
STEP_RATIO_LIMIT = 1.05  # issue #15: "step time <= 1.05x PyTorch's (interleaved medians ...)"


@dataclass(frozen=True)
class Setting:
    """One line of the table: what the user asked, and the run.py configuration of each partitioner for it."""

    label: str
    pytorch: str | None
    fxremat: str | None


SETTINGS = (
    Setting("memory_budget 1.0 (default)", "pytorch_default", "fxremat_default"),
    Setting("memory_budget 0.5", "pytorch_budget_0.5", "fxremat_budget_0.5"),
    Setting("memory_budget 0.2", "pytorch_budget_0.2", "fxremat_budget_0.2"),
    Setting("memory_budget 0.1", "pytorch_budget_0.1", None),
    Setting("memory_budget 0.0", "pytorch_budget_0.0", "fxremat_budget_0.0"),
    Setting("at PyTorch 0.5's saved bytes", None, "fxremat_at_pytorch_0.5"),
    Setting("at PyTorch 0.2's saved bytes", None, "fxremat_at_pytorch_0.2"),
    Setting("at PyTorch 0.1's saved bytes", None, "fxremat_at_pytorch_0.1"),
    Setting("peak_budget 0.5", None, "fxremat_peak_0.5"),
    Setting("peak_budget 0.0", None, "fxremat_peak_0.0"),
    Setting("peak_budget 0.0 within PyTorch 0.5's bytes", None, "fxremat_peak_at_pytorch_0.5"),
    Setting("peak_budget 0.0 within PyTorch 0.1's bytes", None, "fxremat_peak_at_pytorch_0.1"),
    Setting("default, no buffer reuse", None, "fxremat_no_buffer_reuse"),
    Setting("default, reuse bounded by stock Inductor's estimate", None, "fxremat_stock_reuse_bound"),
)
MONOTONE_CHAIN = ("fxremat_default", "fxremat_budget_0.5", "fxremat_budget_0.2")  # memory_budget 1.0, 0.5, 0.2


@dataclass(frozen=True)
class Flag:
    model: str
    config: str  # the row the flag is shown on
    code: str  # "a".."f", "x": the module docstring's list
    text: str


# ---- reading ---------------------------------------------------------------------------------------------------


def load_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The rows of run.py JSON files, later files replacing earlier rows of the same model and configuration."""
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            by_key[(row["model"], row["config"])] = row
    return list(by_key.values())


def by_model(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> config -> row, models in the order they first appear."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["model"], {})[row["config"]] = row
    return out


def _peak(rows: dict[str, dict[str, Any]], config: str | None) -> int | None:
    row = rows.get(config) if config else None
    if row is None or row.get("error"):
        return None
    return row.get("peak_bytes")


# ---- checks ----------------------------------------------------------------------------------------------------


def check_monotone(model: str, rows: dict[str, dict[str, Any]]) -> list[Flag]:
    """(a): each setting's peak against the lowest of the looser settings measured before it."""
    flags, looser = [], []
    for config in MONOTONE_CHAIN:
        peak = _peak(rows, config)
        if peak is None:
            continue
        if looser and peak > (1 + MONOTONE_SLACK) * min(p for _, p in looser):
            base_config, base = min(looser, key=lambda item: item[1])
            flags.append(
                Flag(model, config, "a", f"peak {_mib(peak)} > {_mib(base)} at {base_config} ({peak / base - 1:+.1%})")
            )
        looser.append((config, peak))
    return flags


def _above(model: str, rows, config: str, reference: str, code: str) -> list[Flag]:
    """A flag when ``config``'s measured peak is above ``reference``'s (both measured)."""
    mine, theirs = _peak(rows, config), _peak(rows, reference)
    if mine is None or theirs is None or mine <= theirs:
        return []
    return [Flag(model, config, code, f"peak {_mib(mine)} > {reference}'s {_mib(theirs)} ({_excess(mine, theirs)})")]


def _excess(mine: int, theirs: int) -> str:
    """How far above: in KiB as well, since the check has no slack and a few KiB is a real but small excess."""
    return f"+{(mine - theirs) / 1024:.1f} KiB, {mine / theirs - 1:+.2%}"


def check_against_pytorch(model: str, rows: dict[str, dict[str, Any]]) -> list[Flag]:
    """(b) at 0.0, (c) at 0.5 and 0.2, the same setting and PyTorch's measured bytes."""
    flags = _above(model, rows, "fxremat_budget_0.0", "pytorch_budget_0.0", "b")
    for budget in ("0.5", "0.2"):
        flags += _above(model, rows, f"fxremat_budget_{budget}", f"pytorch_budget_{budget}", "c")
        flags += _above(model, rows, f"fxremat_at_pytorch_{budget}", f"pytorch_budget_{budget}", "c")
    return flags


def check_peak_zero(model: str, rows: dict[str, dict[str, Any]]) -> list[Flag]:
    """(d): peak_budget=0.0 against the lowest peak of every measured row of the model."""
    mine = _peak(rows, "fxremat_peak_0.0")
    others = [(config, _peak(rows, config)) for config in rows]
    others = [(config, peak) for config, peak in others if peak is not None]
    if mine is None or not others:
        return []
    config, lowest = min(others, key=lambda item: item[1])
    if mine <= (1 + LOWEST_SLACK) * lowest:
        return []
    return [
        Flag(
            model, "fxremat_peak_0.0", "d", f"peak {_mib(mine)} > {config}'s {_mib(lowest)} ({mine / lowest - 1:+.1%})"
        )
    ]


def check_rows(model: str, rows: dict[str, dict[str, Any]]) -> list[Flag]:
    """(e) simulation off by more than 10%, (f) gradients not matched, (x) failed rows."""
    flags = []
    for config, row in rows.items():
        if row.get("error"):
            flags.append(Flag(model, config, "x", row["error"].splitlines()[0][:120]))
            continue
        error = row.get("sim_error")
        if error is not None and abs(error) > SIM_TOLERANCE:
            flags.append(
                Flag(
                    model,
                    config,
                    "e",
                    f"simulated {_mib(row['simulated_peak_bytes'])} vs measured "
                    f"{_mib(row['peak_bytes'])} ({error:+.1%})",
                )
            )
        if row.get("grads_matched") is False:
            flags.append(Flag(model, config, "f", f"max gradient error {row.get('max_grad_error')}"))
    return flags


def check_steps(steps: list[dict[str, Any]]) -> list[Flag]:
    """(g): step_interleaved.py's median ratio to PyTorch at the same setting above 1.05."""
    flags = []
    for row in steps:
        ratio = row.get("step_ratio_same_setting")
        if ratio is not None and ratio > STEP_RATIO_LIMIT:
            per = " / ".join(f"{r:.3f}" for r in row["step_ratio_same_setting_per_repetition"])
            text = f"step {ratio:.3f}x {row['same_setting_as']}'s, interleaved (per repetition {per})"
            flags.append(Flag(row["model"], row["config"], "g", text))
    return flags


def all_flags(rows: list[dict[str, Any]], steps: list[dict[str, Any]] = ()) -> list[Flag]:
    """Every check on run.py's rows, then (g) on step_interleaved.py's."""
    flags = []
    for model, model_rows in by_model(rows).items():
        for check in (check_monotone, check_against_pytorch, check_peak_zero, check_rows):
            flags += check(model, model_rows)
    return flags + check_steps(list(steps))


# ---- output ----------------------------------------------------------------------------------------------------

HEADERS = (
    "model",
    "setting",
    "PyTorch saved",
    "PyTorch peak",
    "PyTorch step ms",
    "fxremat saved",
    "fxremat peak",
    "simulated (error)",
    "fxremat step ms",
    "step vs PyTorch, interleaved",
    "flags",
)


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value / MIB:.2f}"


def _step(row: dict[str, Any] | None) -> str:
    return "" if row is None or row.get("step_ms") is None else f"{row['step_ms']:.1f}"


def _simulated(row: dict[str, Any] | None) -> str:
    if row is None or row.get("error"):
        return ""
    if row.get("simulated_peak_bytes") is None:
        return "n/a (" + row["sim_note"].split(":")[0] + ")" if row.get("sim_note") else ""
    return f"{_mib(row['simulated_peak_bytes'])} ({row['sim_error']:+.1%})"


def _side(row: dict[str, Any] | None) -> list[str]:
    """saved, peak of one side; "error" in place of a failed row's figures."""
    if row is None:
        return ["", ""]
    if row.get("error"):
        return ["error", "error"]
    return [_mib(row.get("saved_bytes")), _mib(row.get("peak_bytes"))]


def _interleaved(row: dict[str, Any] | None) -> str:
    ratio = None if row is None else row.get("step_ratio_same_setting")
    return "" if ratio is None else f"{ratio:.3f}x"


def table_lines(rows: list[dict[str, Any]], flags: list[Flag], steps: list[dict[str, Any]] = ()) -> list[str]:
    """One Markdown line per (model, setting) with at least one of its rows measured (by run.py or interleaved);
    the row's flag codes."""
    interleaved = {(row["model"], row["config"]): row for row in steps}
    codes: dict[tuple[str, str], list[str]] = {}
    for flag in flags:
        codes.setdefault((flag.model, flag.config), []).append(flag.code)
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    measured = by_model(rows)
    for model in dict.fromkeys([*measured, *(model for model, _ in interleaved)]):
        model_rows = measured.get(model, {})
        for setting in SETTINGS:
            pytorch, fxremat = model_rows.get(setting.pytorch or ""), model_rows.get(setting.fxremat or "")
            timed = interleaved.get((model, setting.fxremat))
            if pytorch is None and fxremat is None and timed is None:
                continue
            marks = codes.get((model, setting.pytorch), []) + codes.get((model, setting.fxremat), [])
            cells = [
                model,
                setting.label,
                *_side(pytorch),
                _step(pytorch),
                *_side(fxremat),
                _simulated(fxremat),
                _step(fxremat),
                _interleaved(timed),
                ",".join(sorted(set(marks))),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_report(rows: list[dict[str, Any]], steps: list[dict[str, Any]] = ()) -> str:
    flags = all_flags(rows, steps)
    out = [
        "Bytes in MiB; peak: one step's, above what was live at its start (benchmarks/README.md). Step vs PyTorch: "
        "fxremat's median over PyTorch's at the same setting, steps interleaved (step_interleaved.py, --steps).",
        "",
        *table_lines(rows, flags, steps),
        "",
    ]
    if not flags:
        out.append("No flags.")
    for flag in flags:
        out.append(f"- ({flag.code}) {flag.model} / {flag.config}: {flag.text}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="run.py --json files")
    parser.add_argument("--steps", nargs="+", default=[], metavar="JSON", help="step_interleaved.py --json files")
    parser.add_argument("--markdown", default=None, metavar="PATH", help="also write the table here")
    parser.add_argument("--strict", action="store_true", help="exit status 1 when anything is flagged")
    args = parser.parse_args(argv)
    rows, steps = load_rows(args.results), load_rows(args.steps)
    text = format_report(rows, steps)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 1 if args.strict and all_flags(rows, steps) else 0


if __name__ == "__main__":
    sys.exit(main())
