"""The zoo's table and the checks issue #56 judges, from ``zoo.py``'s rows (plain dicts): a record first, then text.
No torch import: ``results_page.py`` builds the results page from it anywhere.

Per (model, size, loss side):
* ``lowest_peak``: ``fxremat_peak_0.0``'s measured peak against the lowest measured peak of every fxremat setting
  (bar: at most ``LOWEST_SLACK`` times it);
* ``monotone``: ``memory_budget`` 1.0 (the default), 0.5, 0.2, 0.0 never raise the simulated peak by more than
  ``MONOTONE_TOLERANCE`` (docs/DESIGN.md's tolerance for a budget's peak);
* ``sim_errors``: each fxremat row's simulated peak against its measured one (bar: within ``SIM_TOLERANCE``);
* ``pytorch_matched``: for PyTorch's 0.5 and 0.2 rows, the fastest fxremat row at a measured peak no higher, and its
  step time's ratio (compared at equal peak, never at equal fraction);
* ``gradients``: every row's verdict against fp64.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tabulate import tabulate

# The settings, in the order the table shows them (zoo.py runs them in this order).
CONFIGS = (
    "pytorch_default",
    "pytorch_budget_0.5",
    "pytorch_budget_0.2",
    "fxremat_default",
    "fxremat_budget_0.5",
    "fxremat_budget_0.2",
    "fxremat_budget_0.0",
    "fxremat_peak_0.5",
    "fxremat_peak_0.0",
)
LOWEST_SLACK = 1.05
MONOTONE_TOLERANCE = 0.02
SIM_TOLERANCE = 0.10
MONOTONE_ORDER = ("fxremat_default", "fxremat_budget_0.5", "fxremat_budget_0.2", "fxremat_budget_0.0")
MIB = 2**20


def groups(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(model, size, loss side) -> config -> row, rows without an error only."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        if row.get("error") is None:
            out[(row["model"], row["size"], row["loss_side"])][row["config"]] = row
    return dict(out)


def _fxremat(configs: dict[str, dict]) -> dict[str, dict]:
    return {c: r for c, r in configs.items() if c.startswith("fxremat_")}


def lowest_peak(configs: dict[str, dict]) -> dict[str, Any] | None:
    mine = _fxremat(configs)
    if "fxremat_peak_0.0" not in mine or len(mine) < 2:
        return None
    best = min(mine, key=lambda c: mine[c]["peak_bytes"])
    ratio = mine["fxremat_peak_0.0"]["peak_bytes"] / mine[best]["peak_bytes"]
    return dict(lowest=best, ratio=ratio, ok=ratio <= LOWEST_SLACK)


def monotone(configs: dict[str, dict]) -> dict[str, Any] | None:
    peaks = [configs[c].get("simulated_peak_bytes") for c in MONOTONE_ORDER if c in configs]
    if len(peaks) < 2 or None in peaks:
        return None
    worst = max(later / earlier - 1 for earlier, later in zip(peaks, peaks[1:]))
    return dict(worst_rise=worst, ok=worst <= MONOTONE_TOLERANCE)


def sim_errors(configs: dict[str, dict]) -> dict[str, float]:
    return {c: r["sim_error"] for c, r in _fxremat(configs).items() if r.get("sim_error") is not None}


def pytorch_matched(configs: dict[str, dict]) -> dict[str, Any]:
    out = {}
    for theirs in ("pytorch_budget_0.5", "pytorch_budget_0.2"):
        if theirs not in configs:
            continue
        bar = configs[theirs]
        fits = {c: r for c, r in _fxremat(configs).items() if r["peak_bytes"] <= bar["peak_bytes"]}
        if not fits:
            out[theirs] = dict(match=None, ok=False)
            continue
        fastest = min(fits, key=lambda c: fits[c]["step_ms"])
        ratio = fits[fastest]["step_ms"] / bar["step_ms"]
        out[theirs] = dict(match=fastest, step_ratio=ratio, ok=ratio <= 1.0)
    return out


def checks(rows: list[dict]) -> dict[tuple, dict[str, Any]]:
    """The record: per (model, size, loss side), each check's figures and whether it holds."""
    out = {}
    for key, configs in sorted(groups(rows).items()):
        errors = sim_errors(configs)
        out[key] = dict(
            lowest_peak=lowest_peak(configs),
            monotone=monotone(configs),
            sim_errors=errors,
            sim_ok=all(abs(e) <= SIM_TOLERANCE for e in errors.values()),
            pytorch_matched=pytorch_matched(configs),
            gradients_right=all(r.get("gradients", {}).get("grads_right", False) for r in configs.values()),
        )
    return out


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    sim = row.get("simulated_peak_bytes")
    text = f"{row['peak_bytes'] / MIB:.1f}" + ("" if sim is None else f" ({sim / MIB:.1f})")
    return text + f" / {row['step_ms']:.0f} ms"


def measured_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(headers, one row per (model, size, loss side): each setting's measured peak MiB (simulated) / step)."""
    found = groups(rows)
    configs = sorted({c for g in found.values() for c in g}, key=_config_order)
    body = [[*key, *(_cell(found[key].get(c)) for c in configs)] for key in sorted(found)]
    return ["model", "size", "loss", *configs], body


def check_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    return _CHECK_HEADERS, _check_rows(checks(rows))


def table(rows: list[dict]) -> str:
    """Measured peak MiB (simulated) / step per setting, then the checks; error rows listed below."""
    headers, body = measured_rows(rows)
    text = tabulate(body, headers=headers, tablefmt="github")
    text += "\n\n" + tabulate(_check_rows(checks(rows)), headers=_CHECK_HEADERS, tablefmt="github")
    errors = [r for r in rows if r.get("error") is not None]
    return text + "".join(f"\n- error: {r['model']} {r['loss_side']} {r['config']}: {r['error'][:200]}" for r in errors)


_CHECK_HEADERS = ["model", "size", "loss", "peak_0.0 / lowest", "monotone (worst rise)", "sim within 10%",
                  "PyTorch 0.5 matched", "PyTorch 0.2 matched", "gradients"]


def _check_rows(record: dict[tuple, dict[str, Any]]) -> list[list[str]]:
    def yes(flag):
        return "" if flag is None else ("yes" if flag else "**no**")

    out = []
    for key, c in record.items():
        low, mono, match = c["lowest_peak"], c["monotone"], c["pytorch_matched"]
        matched = [
            "" if m not in match else f"{match[m]['match']} {match[m].get('step_ratio', float('nan')):.2f}x "
            f"{yes(match[m]['ok'])}" for m in ("pytorch_budget_0.5", "pytorch_budget_0.2")
        ]
        out.append([*key, "" if low is None else f"{low['ratio']:.3f} {yes(low['ok'])}",
                    "" if mono is None else f"{mono['worst_rise']:+.1%} {yes(mono['ok'])}",
                    f"{max(map(abs, c['sim_errors'].values()), default=0):.1%} {yes(c['sim_ok'])}",
                    *matched, yes(c["gradients_right"])])
    return out


def _config_order(config: str) -> tuple:
    return (CONFIGS.index(config) if config in CONFIGS else len(CONFIGS), config)
