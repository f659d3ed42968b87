"""The text rendering of ``CutReport`` (``format_text``, the CLI's default), and the pieces the HTML rendering
shares with it: byte and source formatting, the summary table, why a figure is missing."""

from __future__ import annotations

import re

from fxremat_passes.rewrite.describe import SavedValue

from ..report import CutReport, diff_default, saved_by_bytes


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"


_SOURCE_LINE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def short_source(source: str | None) -> str:
    """'File "/src/model.py", line 39, in _attend' -> 'model.py:39 _attend': the full path rarely fits a table."""
    if not source:
        return ""
    match = _SOURCE_LINE.search(source)
    if not match:
        return source
    filename = re.split(r"[\\/]", match.group("path"))[-1]
    return f"{filename}:{match.group('line')} {match.group('func')}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


# What a report without PyTorch's default partition says in its place (never zeros, never a blank).
NOT_COMPARED = "not compared (compare_default=False)"


def baseline_status(report: CutReport) -> str | None:
    """None when the report carries PyTorch's default partition of the same graph; otherwise why it does not:
    the comparison was not asked for (``compare_default=False``, the default), or it failed."""
    if report.baseline_saved_bytes is not None:
        return None
    if report.baseline_error:
        return f"failed: {report.baseline_error}"
    return NOT_COMPARED


def peak_status(report: CutReport) -> str | None:
    """None when the report has its simulated peak (or can still compute it); otherwise why it has none."""
    if report.pending_fields() or report.simulated_peak_bytes is not None:
        return None
    if report.from_cache:
        return "not stored with the compile-cache entry (the store keeps peaks with compare_default=True)"
    return "not simulated"


def summary_headers(report: CutReport) -> list[str]:
    """The summary table's columns: PyTorch default's and the ratio only when the report has that partition."""
    return ["", "fxremat"] if baseline_status(report) else ["", "fxremat", "PyTorch default", "ratio"]


def summary_rows(report: CutReport) -> list[list[str]]:
    """The summary table (columns as ``summary_headers``)."""
    rows = _summary_rows(report)
    return [row[:2] for row in rows] if baseline_status(report) else rows


def _summary_rows(report: CutReport) -> list[list[str]]:
    return [
        [
            "saved bytes",
            format_bytes(report.saved_bytes),
            format_bytes(report.baseline_saved_bytes),
            _ratio(report.saved_bytes, report.baseline_saved_bytes),
        ],
        [
            "recompute FLOPs",
            f"{report.recompute_flops:,}",
            "-" if report.baseline_recompute_flops is None else f"{report.baseline_recompute_flops:,}",
            _ratio(report.recompute_flops, report.baseline_recompute_flops),
        ],
        [
            "est. recompute time",
            f"{report.est_recompute_seconds * 1e6:.1f} us",
            "-"
            if report.baseline_est_recompute_seconds is None
            else f"{report.baseline_est_recompute_seconds * 1e6:.1f} us",
            _ratio(report.est_recompute_seconds, report.baseline_est_recompute_seconds),
        ],
        [
            "partition time",
            f"{report.partition_seconds * 1e3:.1f} ms",
            "-" if report.baseline_seconds is None else f"{report.baseline_seconds * 1e3:.1f} ms",
            "-",
        ],
    ] + _peak_rows(report)


def _peak_rows(report: CutReport) -> list[list[str]]:
    """The simulated step peak (passes/simulator/liveness.py) and the node where it is reached, when simulated."""
    if report.simulated_peak_bytes is None:
        return []
    return [
        [
            "simulated step peak",
            format_bytes(report.simulated_peak_bytes),
            format_bytes(report.baseline_simulated_peak_bytes),
            _ratio(report.simulated_peak_bytes, report.baseline_simulated_peak_bytes),
        ],
        ["simulated peak at", report.simulated_peak_at or "-", report.baseline_simulated_peak_at or "-", "-"],
    ] + _caller_rows(report)


def _caller_rows(report: CutReport) -> list[list[str]]:
    """The part of the step outside the graph (the caller's loss: Options.caller_bytes), where there is one."""
    if not report.simulated_caller_bytes:
        return []
    return [["caller's loss between the graphs", format_bytes(report.simulated_caller_bytes), "-", "-"]]


def saved_value_cells(r: SavedValue) -> list[str]:
    """name, op, shape, dtype, bytes, module, source: one saved value as table cells (text and HTML alike)."""
    shape = "x".join(map(str, r.shape))
    return [r.name, r.op, shape, r.dtype, format_bytes(r.nbytes), r.module or "", short_source(r.source)]


def _saved_table(saved: tuple[SavedValue, ...], max_rows: int) -> str:
    from tabulate import tabulate

    rows = [[*saved_value_cells(r), "" if r.counted else "not counted"] for r in saved[:max_rows]]
    table = tabulate(rows, headers=["value", "op", "shape", "dtype", "bytes", "module", "source", ""])
    if len(saved) > max_rows:
        table += f"\n... and {len(saved) - max_rows} more"
    return table


def format_diff_text(report: CutReport, max_rows: int = 20) -> str:
    """``--diff-default``: the values only one of the two partitioners keeps for backward."""
    diff = diff_default(report)
    if diff is None:
        return f"no PyTorch default partition to compare with: {baseline_status(report)}"
    lines = [f"saved by both: {len(diff.both)} values"]
    for title, rows in (
        ("saved only by fxremat", diff.only_fxremat),
        ("saved only by PyTorch default", diff.only_default),
    ):
        # a saved slice keeps its whole storage alive: count storages, as saved_bytes does
        counted = sum(r.nbytes if r.storage_nbytes is None else r.storage_nbytes for r in rows if r.counted)
        lines.append("")
        lines.append(f"{title}: {len(rows)} values, {format_bytes(counted)} counted")
        if rows:
            lines.append(_saved_table(rows, max_rows))
    return "\n".join(lines)


def budget_lines(report: CutReport) -> list[str]:
    """What was asked and what was achieved: the saved-bytes budget and the peak budget."""
    lines = []
    if report.budget_bytes is not None:
        lines.append(
            f"memory_budget {report.memory_budget!r} (from {report.memory_budget_source}): "
            f"at most {format_bytes(report.budget_bytes)} saved -> "
            f"{format_bytes(report.saved_bytes)} ({'met' if report.budget_met else 'NOT met: fewest-bytes plan'})"
        )
    if report.region_budgets:
        lines.append(f"per-region budgets ({'met' if report.budget_met else 'NOT met: fewest-bytes plan'}):")
    for name, budget, saved, target, _, _ in report.region_budgets:
        bound = "no budget" if target is None else f"budget {budget!r}, at most {format_bytes(target)}"
        lines.append(f"  {name}: {bound} -> {format_bytes(saved)} saved")
    if report.budget_simulated is not None:
        raised = report.peak_raised_by_budget
        lines.append(
            f"  the fastest of {report.budget_simulated} simulated plans (of {report.budget_candidates} candidates) "
            "whose step peak is no higher than at any looser budget"
            + (f"; NONE within this budget: the lowest-peak one, {format_bytes(raised)} higher" if raised else "")
        )
    if isinstance(report.peak_budget, float):  # relative to the candidates' estimated peaks
        lines.append(
            f"peak_budget {report.peak_budget!r}: the fastest of {report.peak_simulated} simulated plans (of "
            f"{report.peak_candidates} candidates) whose step peak is at most "
            f"{format_bytes(report.peak_budget_bytes)} -> {format_bytes(report.simulated_peak_bytes)}"
        )
    elif report.peak_budget is not None:
        lines.append(
            f"peak_budget {report.peak_budget!r}: step peak at most {format_bytes(report.peak_budget_bytes)} "
            f"-> {format_bytes(report.simulated_peak_bytes)} simulated "
            f"({'met' if report.peak_budget_met else 'NOT met: lowest-peak plan'}; "
            f"{report.peak_candidates} candidate plans)"
        )
    return lines + _offload_lines(report)


def _offload_lines(report: CutReport) -> list[str]:
    """The offloaded storages (docs/DESIGN.md §16): each one's bytes and the stalls it causes."""
    if not report.offloaded:
        return []
    lines = [
        f"offload: {len(report.offloaded)} storages, "
        f"{format_bytes(sum(row[1] for row in report.offloaded))}, step peak -> "
        f"{format_bytes(report.offload_peak_bytes)} simulated, exposed {report.offload_exposed_seconds * 1e3:.3f} ms"
    ]
    lines += [
        f"  {name}: {format_bytes(nbytes)}, exposed {exposed * 1e3:.3f} ms"
        for name, nbytes, exposed, *_ in report.offloaded
    ]
    return lines


def loss_lines(report: CutReport) -> list[str]:
    """The loss regions (docs/DESIGN.md §14): each region, its chunks or why it was left as traced; each count of
    chunks tried with its simulated step peak and estimated step time; the floor no count goes below."""
    lines = []
    for projection, tokens, vocab, chunks, why, form in report.loss_regions:
        done = f"{chunks} chunks" if chunks else f"left as traced ({why})" if why else "left as traced"
        if form and form != "forward":  # loss_chunks.BACKWARD or RECOMPUTED
            done += f" (the logits returned: the gradients in {form})"
        lines.append(f"loss region {projection} ({tokens:,} tokens x {vocab:,} vocabulary): {done}")
    if report.loss_chunks_tried:
        tried = ", ".join(
            f"{'as traced' if k == 0 else f'{k} chunks'} {format_bytes(peak)} ({seconds * 1e3:.2f} ms est.)"
            for k, peak, seconds in report.loss_chunks_tried
        )
        lines.append(f"  simulated step peak: {tried}")
    if report.loss_peak_floor_bytes is not None:
        floor = format_bytes(report.loss_peak_floor_bytes)
        lines.append(f"  floor (the gradients, and any returned logits with their zero gradient): {floor}")
    return lines


def format_text(report: CutReport, max_rows: int = 20, diff: bool = False) -> str:
    from tabulate import tabulate

    lines = [
        f"fxremat cut report: {report.graph_id} ({report.num_joint_nodes} joint nodes, "
        f"device profile {report.device_profile})"
    ]
    if report.fallback_reason:
        lines.append(f"FELL BACK to PyTorch's default partitioner: {report.fallback_reason}")
    lines.append(tabulate(summary_rows(report), headers=summary_headers(report)))
    status = baseline_status(report)
    if status:
        lines.append(f"PyTorch default partition: {status}")
    peak = peak_status(report)
    if peak:
        lines.append(f"simulated step peak: {peak}")
    if report.layout_simulated_peaks is not None:
        contiguous, channels_last = (format_bytes(n) for n in report.layout_simulated_peaks)
        lines.append(
            f"layout handed to Inductor: {report.inductor_layout} (simulated step peak contiguous {contiguous}, "
            f"channels-last {channels_last})"
        )
    lines.extend(budget_lines(report))
    lines.extend(loss_lines(report))
    saved = saved_by_bytes(report.saved)
    if saved:
        lines.append("")
        lines.append(f"saved for backward ({len(saved)} tensors; inputs and repeated storages not counted):")
        lines.append(_saved_table(saved, max_rows))
    if report.recomputed:
        why = dict(report.recompute_reasons)
        lines.append("")
        lines.append(f"recomputed in backward ({len(report.recomputed)} nodes):")
        ordered = sorted(report.recomputed, key=lambda r: (-r.flops, r.name))
        rows = [[r.name, r.op, f"{r.flops:,}", why.get(r.name, "")] for r in ordered[:max_rows]]
        lines.append(tabulate(rows, headers=["node", "op", "FLOPs", "why"]))
        if len(ordered) > max_rows:
            lines.append(f"... and {len(ordered) - max_rows} more")
    if report.never_recomputed:
        lines.append("")
        lines.append(
            "never recomputed: " + "; ".join(f"{reason} ({count})" for reason, count in report.never_recomputed)
        )
    for name, conflict in report.tag_conflicts:
        lines.append(f"tag overridden on {name}: {conflict}")
    if report.user_plan_saved_bytes is not None:
        user = (format_bytes(report.user_plan_saved_bytes), format_bytes(report.user_plan_simulated_peak_bytes))
        lines.append("checkpoints honoured: within the user's plan's %s saved and %s simulated peak" % user)
    lines.extend(f"checkpointed value kept: {name}: {why}" for name, why in report.checkpoint_kept)
    if diff:
        lines.append("")
        lines.append("compared with PyTorch's default partition:")
        lines.append(format_diff_text(report, max_rows))
    return "\n".join(lines)
