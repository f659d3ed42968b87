"""The HTML rendering of ``CutReport``: one self-contained file, inline CSS and SVG (``svg.py`` draws the charts),
no script, nothing fetched from the network, every piece of text passed through ``html.escape``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fxremat_passes.rewrite.describe import SavedValue

from ..report import CutReport, diff_default
from .svg import _e, _natural_key, format_seconds, svg_memory_timelines, svg_module_bars, svg_pareto
from .text import baseline_status, peak_status, saved_value_cells, summary_headers, summary_rows

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111827; margin: 24px auto;
       max-width: 1120px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 36px; border-bottom: 1px solid #e5e7eb; }
h3 { font-size: 15px; margin: 22px 0 8px; }
.meta { color: #6b7280; } .warn { background: #fef3c7; border: 1px solid #f59e0b; padding: 8px 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { padding: 3px 10px; text-align: left; border-bottom: 1px solid #e5e7eb; vertical-align: top; }
th { background: #f3f4f6; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
th, td { white-space: nowrap; } tr:nth-child(even) td { background: #fafafa; } tr.dim td { color: #9ca3af; }
.charts { display: flex; flex-wrap: wrap; gap: 32px; align-items: flex-start; } figure { margin: 0; }
.note { color: #6b7280; font-size: 12px; margin-top: 0; }
.scroll { overflow-x: auto; } code { font-size: 12px; }
"""


def _html_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: frozenset[int] = frozenset(),
    dim: Sequence[bool] = (),
) -> str:
    """``numeric``: right-aligned column indices; ``dim``: rows shown grey (values that cost no bytes)."""
    head = "".join(
        f'<th class="num">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for index, row in enumerate(rows):
        cells = "".join(
            f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>" for i, c in enumerate(row)
        )
        greyed = index < len(dim) and dim[index]
        body.append(f'<tr class="dim">{cells}</tr>' if greyed else f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _saved_rows(rows: Iterable[SavedValue], also: set[str] | None) -> tuple[list[list[str]], list[bool]]:
    """Table rows, biggest counted values first, and which of them are greyed (not counted)."""
    table, dim = [], []
    for r in sorted(rows, key=lambda r: (-r.nbytes * r.counted, _natural_key(r.name))):
        row = [*saved_value_cells(r), "yes" if r.counted else "no"]
        if also is not None:
            row.append("yes" if r.name in also else "no")
        table.append(row)
        dim.append(not r.counted)
    return table, dim


_COUNTED_NOTE = (
    '<p class="note">counted = no: a graph input (parameter, buffer, user input) or a second view of a storage '
    "already counted; it adds no bytes.</p>"
)


_SAVED_HEADERS = ["value", "op", "shape", "dtype", "bytes", "module", "source", "counted"]


def _html_saved(report: CutReport) -> str:
    has_baseline = report.baseline_saved_bytes is not None
    also = {r.name for r in report.baseline_saved} if has_baseline else None
    headers = _SAVED_HEADERS + (["also saved by PyTorch default"] if has_baseline else [])
    rows, dim = _saved_rows(report.saved, also)
    return (
        f"<h3>Saved for backward by fxremat ({len(report.saved)} tensors)</h3>"
        + _html_table(headers, rows, frozenset({4}), dim)
        + _COUNTED_NOTE
    )


def _html_recomputed(report: CutReport) -> str:
    why = dict(report.recompute_reasons)
    ordered = sorted(report.recomputed, key=lambda r: (-r.flops, r.name))
    rows = [[r.name, r.op, f"{r.flops:,}", format_seconds(r.est_seconds), why.get(r.name, "")] for r in ordered]
    parts = [f"<h3>Recomputed in backward ({len(ordered)} nodes)</h3>"]
    if rows:
        parts.append(_html_table(["node", "op", "FLOPs", "est. time", "why"], rows, frozenset({2, 3})))
    else:
        parts.append("<p>Nothing is recomputed.</p>")
    if report.never_recomputed:
        rows = [[reason, count] for reason, count in report.never_recomputed]
        parts.append("<h3>Never recomputed (safety rules)</h3>")
        parts.append(_html_table(["reason", "nodes"], rows, frozenset({1})))
    if report.tag_conflicts:
        parts.append("<h3>Checkpoint tags overridden</h3>")
        parts.append(_html_table(["node", "what happened"], report.tag_conflicts))
    return "".join(parts)


def _html_diff(report: CutReport) -> str:
    found = diff_default(report)
    if found is None:
        why = _e(baseline_status(report))
        return f"<h3>Compared with PyTorch default</h3><p>No PyTorch default partition to compare with: {why}.</p>"
    parts = [f"<h3>Compared with PyTorch default</h3><p>Saved by both: {len(found.both)} values.</p>"]
    for title, rows in (
        ("Saved only by fxremat", found.only_fxremat),
        ("Saved only by PyTorch default", found.only_default),
    ):
        parts.append(f"<h3>{_e(title)} ({len(rows)})</h3>")
        if rows:
            table, dim = _saved_rows(rows, None)
            parts.append(_html_table(_SAVED_HEADERS, table, frozenset({4}), dim))
        else:
            parts.append("<p>None.</p>")
    return "".join(parts)


def _html_report(report: CutReport, diff: bool) -> str:
    parts = [f'<section id="{_e(report.graph_id)}"><h2>{_e(report.graph_id)}</h2>']
    meta = (
        f"{report.num_joint_nodes} joint nodes; device profile {report.device_profile}; memory_price "
        f"{report.memory_price:g}; memory_budget {report.memory_budget}; torch {report.torch_version}"
        + ("; re-emitted from the compile cache" if report.from_cache else "")
    )
    parts.append(f'<p class="meta">{_e(meta)}</p>')
    if report.fallback_reason:
        parts.append(f'<p class="warn">Fell back to PyTorch\'s default partitioner: {_e(report.fallback_reason)}</p>')
    if report.baseline_error:
        parts.append(f'<p class="warn">PyTorch default partition failed: {_e(report.baseline_error)}</p>')
    parts.append(_html_table(summary_headers(report), summary_rows(report), frozenset({1, 2, 3})))
    status = baseline_status(report)
    if status and not report.baseline_error:
        parts.append(f'<p class="note not-compared">PyTorch default partition: {_e(status)}.</p>')
    peak = peak_status(report)
    if peak:
        parts.append(f'<p class="note">Simulated step peak: {_e(peak)}.</p>')
    parts.append('<div class="charts">')
    parts.append(f"<figure><figcaption><h3>Saved bytes per module</h3></figcaption>{svg_module_bars(report)}</figure>")
    note = '<p class="note">Lower left is better. The frontier: fxremat\'s plans at other memory prices.</p>'
    parts.append(f"<figure><figcaption><h3>Memory vs recompute</h3>{note}</figcaption>{svg_pareto(report)}</figure>")
    parts.append("</div>")
    if report.memory_timeline:
        note = (
            '<p class="note">Simulated bytes live over one training step (passes/simulator/liveness.py: '
            "Inductor's kernel order and fusion, buffers freed at last use), parameters and inputs not counted; "
            "gradients are.</p>"
        )
        parts.append(
            f'<figure class="timeline"><figcaption><h3>Memory timeline</h3>{note}</figcaption>'
            f'<div class="charts">{svg_memory_timelines(report)}</div></figure>'
        )
    parts.append(_html_saved(report))
    parts.append(_html_recomputed(report))
    if diff:
        parts.append(_html_diff(report))
    parts.append("</section>")
    return "".join(parts)


def format_html(reports: Sequence[CutReport], title: str = "fxremat cut report", diff: bool = False) -> str:
    """One self-contained HTML document with a section per report."""
    nav = ""
    if len(reports) > 1:
        links = " · ".join(f'<a href="#{_e(r.graph_id)}">{_e(r.graph_id)}</a>' for r in reports)
        nav = f"<p>{len(reports)} graphs: {links}</p>"
    body = "".join(_html_report(r, diff) for r in reports) or "<p>No reports.</p>"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{_e(title)}</h1>{nav}{body}</body></html>\n"
    )
