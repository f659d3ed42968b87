"""The SVG charts of ``CutReport``'s HTML rendering (``html.py``).

Data first: ``module_bytes``, ``pareto_points`` and ``timeline_series`` compute what is shown; the ``_svg_*``
helpers only draw it, every piece of text passed through ``html.escape``.
"""

from __future__ import annotations

import html
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fxremat_passes.rewrite.describe import SavedValue

from ..report import CutReport
from .text import format_bytes

log = logging.getLogger(__name__)

TOP_LEVEL = "(top level)"  # saved values computed by the compiled module's own code, outside any submodule
FXREMAT_COLOR = "#2563eb"
DEFAULT_COLOR = "#9ca3af"
FRONTIER_COLOR = "#ea580c"


# --- chart data ----------------------------------------------------------------------------------------------------


def _natural_key(text: str) -> list:
    """'blocks.10' after 'blocks.2': layers in model order, not string order."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def module_bytes(rows: Iterable[SavedValue]) -> dict[str, int]:
    """Counted saved bytes per module path: each counted row's whole storage (a saved slice keeps all of it
    alive), so that one partitioner's bars add up to its ``saved_bytes``.  Rows from reports written before
    ``storage_nbytes`` existed fall back to the tensor's own bytes."""
    totals: dict[str, int] = {}
    for row in rows:
        if row.counted:
            key = row.module or TOP_LEVEL
            size = row.storage_nbytes if row.storage_nbytes is not None else row.nbytes
            totals[key] = totals.get(key, 0) + size
    return totals


def module_rows(report: CutReport) -> list[tuple[str, int, int | None]]:
    """(module, fxremat bytes, PyTorch default bytes or None) for every module either side keeps bytes for."""
    ours = module_bytes(report.saved)
    has_baseline = report.baseline_saved_bytes is not None
    theirs = module_bytes(report.baseline_saved) if has_baseline else {}
    names = sorted(set(ours) | set(theirs), key=lambda m: (m == TOP_LEVEL, _natural_key(m)))
    return [(m, ours.get(m, 0), theirs.get(m, 0) if has_baseline else None) for m in names]


@dataclass(frozen=True)
class ParetoPoint:
    label: str
    saved_bytes: int
    seconds: float
    color: str


def pareto_points(report: CutReport) -> list[ParetoPoint]:
    points = [ParetoPoint("fxremat", report.saved_bytes, report.est_recompute_seconds, FXREMAT_COLOR)]
    if report.baseline_saved_bytes is not None and report.baseline_est_recompute_seconds is not None:
        points.append(
            ParetoPoint(
                "PyTorch default",
                report.baseline_saved_bytes,
                report.baseline_est_recompute_seconds,
                DEFAULT_COLOR,
            )
        )
    for budget, saved, seconds in getattr(report, "baseline_budget_points", ()) or ():
        points.append(ParetoPoint(f"PyTorch budget {budget:g}", int(saved), float(seconds), DEFAULT_COLOR))
    return points


def frontier_points(report: CutReport) -> list[tuple[int, float, float]]:
    """(saved bytes, est. recompute seconds, memory price), fewest seconds first.  ``frontier`` arrives with the
    memory-budget work; reports without it (older JSON included) simply have no frontier."""
    found = []
    for entry in getattr(report, "frontier", ()) or ():
        saved, seconds, price = entry
        found.append((int(saved), float(seconds), float(price)))
    return sorted(found, key=lambda p: (p[1], -p[0]))


# --- SVG -------------------------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def format_seconds(seconds: float) -> str:
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _nice_ticks(high: float, count: int = 5) -> list[float]:
    """0 and round steps up to at least ``high`` (a range that starts at 0 shows ratios honestly)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [0.0]
    while ticks[-1] < high:
        ticks.append(ticks[-1] + step)
    return ticks


def _byte_ticks(high: float) -> list[float]:
    """Ticks that are round in KiB/MiB/GiB (decimal-round byte counts read as 244.14 KiB)."""
    unit = 1.0
    while unit * 1024 <= high and unit < 2**30:
        unit *= 1024
    return [tick * unit for tick in _nice_ticks(high / unit)]


def _svg_open(width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}"><title>{_e(label)}</title>'
    )


def _svg_text(
    x: float, y: float, text: str, anchor: str = "start", size: int = 12, extra: str = "", tooltip: str = ""
) -> str:
    tip = f"<title>{_e(tooltip)}</title>" if tooltip else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {extra}>{tip}{_e(text)}</text>'


def _svg_legend(x: float, y: float, entries: list[tuple[str, str]]) -> list[str]:
    parts = []
    for label, color in entries:
        parts.append(f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" fill="{color}"/>')
        parts.append(_svg_text(x + 16, y, label))
        x += 28 + 7 * len(label)
    return parts


def svg_module_bars(report: CutReport) -> str:
    """Horizontal grouped bars: counted saved bytes per module, fxremat and PyTorch default side by side."""
    rows = module_rows(report)
    title = "saved bytes per module"
    if not rows:
        return _svg_open(400, 40, title) + _svg_text(8, 24, "nothing saved for backward") + "</svg>"
    label_width = min(320, 16 + 7 * max(len(name) for name, _, _ in rows))
    bar_width, bar_height, value_width = 330, 11, 76
    has_baseline = rows[0][2] is not None
    row_height = bar_height * (2 if has_baseline else 1) + 10
    top = 34
    width = label_width + bar_width + value_width
    height = top + row_height * len(rows) + 8
    largest = max(max(ours, theirs or 0) for _, ours, theirs in rows) or 1
    parts = [_svg_open(width, height, title)]
    legend = [("fxremat", FXREMAT_COLOR)] + ([("PyTorch default", DEFAULT_COLOR)] if has_baseline else [])
    parts += _svg_legend(label_width, 16, legend)
    for index, (name, ours, theirs) in enumerate(rows):
        y = top + index * row_height
        parts.append(
            f'<line x1="{label_width}" x2="{label_width}" y1="{y - 3}" y2="{y + row_height - 5}" stroke="#374151"/>'
        )
        shown = name if len(name) * 7 <= label_width - 16 else "..." + name[-((label_width - 16) // 7 - 3) :]
        parts.append(
            _svg_text(
                label_width - 8, y + row_height / 2, shown, "end", extra='dominant-baseline="middle"', tooltip=name
            )
        )
        bars = [(ours, FXREMAT_COLOR, "fxremat")] + (
            [(theirs, DEFAULT_COLOR, "PyTorch default")] if has_baseline else []
        )
        for offset, (value, color, who) in enumerate(bars):
            length = bar_width * value / largest
            by = y + offset * bar_height
            parts.append(
                f'<rect x="{label_width}" y="{by}" width="{length:.1f}" height="{bar_height - 1}" fill="{color}">'
                f"<title>{_e(f'{name}: {who} keeps {format_bytes(value)}')}</title></rect>"
            )
            parts.append(_svg_text(label_width + length + 4, by + bar_height - 2, format_bytes(value), size=10))
    parts.append("</svg>")
    return "".join(parts)


def svg_pareto(report: CutReport) -> str:
    """Saved bytes against estimated recompute time: fxremat, PyTorch default, and the frontier when known."""
    points = pareto_points(report)
    frontier = frontier_points(report)
    title = "saved bytes vs estimated recompute time"
    width, height = 480, 340
    left, right, top, bottom = 86, 24, 40, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    headroom = 1.1  # no point on the frame, where its label would run into the legend
    x_ticks = _nice_ticks(headroom * max([p.seconds for p in points] + [f[1] for f in frontier]))
    y_ticks = _byte_ticks(headroom * max([p.saved_bytes for p in points] + [f[0] for f in frontier]))

    def sx(seconds: float) -> float:
        return left + plot_w * seconds / x_ticks[-1]

    def sy(saved: float) -> float:
        return top + plot_h * (1 - saved / y_ticks[-1])

    parts = [_svg_open(width, height, title)]
    for tick in x_ticks:
        parts.append(f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#e5e7eb"/>')
        parts.append(_svg_text(sx(tick), top + plot_h + 16, format_seconds(tick), "middle", 10))
    for tick in y_ticks:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" stroke="#e5e7eb"/>'
        )
        parts.append(_svg_text(left - 6, sy(tick) + 3, format_bytes(int(tick)).replace(".00 ", " "), "end", 10))
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#374151"/>')
    parts.append(_svg_text(left + plot_w / 2, height - 12, "estimated recompute time", "middle"))
    parts.append(
        _svg_text(16, top + plot_h / 2, "saved bytes", "middle", extra=f'transform="rotate(-90 16 {top + plot_h / 2})"')
    )
    budget = getattr(report, "budget_bytes", None)
    if budget is not None and budget <= y_ticks[-1]:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(budget):.1f}" y2="{sy(budget):.1f}" '
            f'stroke="{FRONTIER_COLOR}" stroke-dasharray="5 4"/>'
        )
        label = f"budget {format_bytes(budget)}"
        parts.append(_svg_text(left + plot_w - 4, sy(budget) - 4, label, "end", 10, f'fill="{FRONTIER_COLOR}"'))
    parts += _pareto_marks(points, frontier, sx, sy, left + plot_w * 0.7)
    # one legend entry per colour: PyTorch's default and budget points share one (each point is labelled anyway)
    legend = list({p.color: ("fxremat" if p.color == FXREMAT_COLOR else "PyTorch", p.color) for p in points}.values())
    legend += [("frontier", FRONTIER_COLOR)] if frontier else []
    parts += _svg_legend(left, 20, legend)
    parts.append("</svg>")
    return "".join(parts)


def _pareto_marks(points, frontier, sx, sy, label_left_of: float) -> list[str]:
    """The frontier's line and dots, then each plan's labelled point (its label on the left past ``label_left_of``,
    so that it stays inside the frame)."""
    parts = []
    if frontier:
        coords = " ".join(f"{sx(s):.1f},{sy(b):.1f}" for b, s, _ in frontier)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{FRONTIER_COLOR}" stroke-width="2"/>')
        for saved, seconds, price in frontier:
            tip = f"memory_price {price:g}: {format_bytes(saved)}, {format_seconds(seconds)}"
            parts.append(
                f'<circle cx="{sx(seconds):.1f}" cy="{sy(saved):.1f}" r="3" fill="{FRONTIER_COLOR}">'
                f"<title>{_e(tip)}</title></circle>"
            )
    for point in points:
        x, y = sx(point.seconds), sy(point.saved_bytes)
        tip = f"{point.label}: {format_bytes(point.saved_bytes)}, {format_seconds(point.seconds)}"
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{point.color}" stroke="#111827">'
            f"<title>{_e(tip)}</title></circle>"
        )
        anchor = "end" if x > label_left_of else "start"
        parts.append(_svg_text(x + (-10 if anchor == "end" else 10), y - 8, point.label, anchor))
    return parts


@dataclass(frozen=True)
class TimelineSeries:
    """One split's simulated memory timeline, as a chart draws it."""

    label: str  # "fxremat" or "PyTorch default"
    color: str
    points: tuple[tuple[str, str, int], ...]  # (phase, node, bytes live after it)
    peak_index: int  # the point where the peak is reached
    backward_index: int | None  # the first backward point (None: the timeline has no backward)
    peak_at: str  # "phase:node"


def timeline_series(report: CutReport) -> list[TimelineSeries]:
    """fxremat's timeline, then PyTorch default's when the report carries it."""
    series = []
    for label, color, points, peak_at in (
        ("fxremat", FXREMAT_COLOR, report.memory_timeline, report.simulated_peak_at),
        ("PyTorch default", DEFAULT_COLOR, report.baseline_memory_timeline, report.baseline_simulated_peak_at),
    ):
        if not points:
            continue
        named = [i for i, (phase, node, _) in enumerate(points) if f"{phase}:{node}" == peak_at]
        peak_index = named[0] if named else max(range(len(points)), key=lambda i: points[i][2])
        backward = next((i for i, point in enumerate(points) if point[0] == "backward"), None)
        peak_at = f"{points[peak_index][0]}:{points[peak_index][1]}"
        series.append(TimelineSeries(label, color, tuple(points), peak_index, backward, peak_at))
    return series


def svg_memory_timelines(report: CutReport) -> str:
    """Bytes live over the step (forward, then backward), one step chart per split on one byte scale, the peak
    marked and labelled, the forward/backward boundary dashed."""
    series = timeline_series(report)
    if not series:
        return _svg_open(400, 40, "memory timeline") + _svg_text(8, 24, "no memory simulation") + "</svg>"
    y_ticks = _byte_ticks(1.15 * max(p[2] for s in series for p in s.points))
    return "".join(_svg_timeline(s, y_ticks) for s in series)


def _svg_timeline(series: TimelineSeries, y_ticks: list[float]) -> str:
    width, height = 480, 300
    left, right, top, bottom = 86, 24, 40, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(series.points)

    def sx(i: float) -> float:
        return left + plot_w * i / n

    def sy(nbytes: float) -> float:
        return top + plot_h * (1 - nbytes / y_ticks[-1])

    title = f"memory timeline: {series.label}"
    parts = [_svg_open(width, height, title)]
    for tick in y_ticks:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" stroke="#e5e7eb"/>'
        )
        parts.append(_svg_text(left - 6, sy(tick) + 3, format_bytes(int(tick)).replace(".00 ", " "), "end", 10))
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#374151"/>')
    parts.append(_svg_text(left + plot_w / 2, height - 12, f"{series.label}: nodes in execution order", "middle"))
    parts.append(
        _svg_text(16, top + plot_h / 2, "bytes live", "middle", extra=f'transform="rotate(-90 16 {top + plot_h / 2})"')
    )
    if series.backward_index is not None:
        x = sx(series.backward_index)
        parts.append(
            f'<line class="boundary" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" stroke="#374151" '
            'stroke-dasharray="4 3"/>'
        )
        parts.append(_svg_text(x - 4, top + 12, "forward", "end", 10))
        parts.append(_svg_text(x + 4, top + 12, "backward", "start", 10))
    # a step chart: each point holds its bytes until the next node runs
    vertices = []
    for i, (_, _, nbytes) in enumerate(series.points):
        vertices += [f"{sx(i):.1f},{sy(nbytes):.1f}", f"{sx(i + 1):.1f},{sy(nbytes):.1f}"]
    parts.append(
        f'<polyline class="timeline" data-points="{n}" points="{" ".join(vertices)}" fill="none" '
        f'stroke="{series.color}" stroke-width="1.5"/>'
    )
    peak = series.points[series.peak_index][2]
    x, y = sx(series.peak_index + 0.5), sy(peak)
    label = f"peak {format_bytes(peak)} at {series.peak_at}"
    parts.append(
        f'<circle class="peak" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{FRONTIER_COLOR}" stroke="#111827">'
        f"<title>{_e(label)}</title></circle>"
    )
    anchor = "end" if x > left + plot_w / 2 else "start"
    dx = -8 if anchor == "end" else 8
    label_y = max(top + 40, y - 8)  # below the forward/backward words
    parts.append(_svg_text(x + dx, label_y - 13, f"peak {format_bytes(peak)}", anchor, 11, 'class="peak-label"'))
    parts.append(_svg_text(x + dx, label_y, f"at {series.peak_at}", anchor, 11, 'class="peak-label"'))
    parts.append("</svg>")
    return "".join(parts)
