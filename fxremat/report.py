"""CutReport: what fxremat chose for one joint graph, as data; formatters are separate functions.

Build the record first (``CutReport``), then format it (``format_text``, ``CutReport.to_dict``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fxremat_passes.describe import RecomputedNode, SavedValue, SplitDescription

from .deferred import Deferred, _DeferrableField
from .report_fields import decoders, derived  # noqa: F401 (derived: for a derived field, docs/examples)

# to_dict's "schema_version": it changes only when a key changes meaning or goes away (README, "Report JSON schema").
# 2: "extra" (an always-empty object that nothing filled) removed (issue #18).
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class CutReport:
    """One compiled joint graph.

    ``saved_bytes``: activation bytes kept for backward (distinct storages, graph inputs excluded).
    ``baseline_*``: the same figures for PyTorch's default ``min_cut_rematerialization_partition`` on a copy of
    the same joint graph (None when ``compare_default=False`` or when it failed).
    ``fallback_reason``: None unless fxremat fell back to PyTorch's partitioner for this graph.

    The simulated-peak fields (``DEFERRED_FIELDS``) are computed when first read, not while partitioning: until
    then the report holds what the simulation needs (the joint graph and the split's recipe).

    A new field: declare it here with its type (``from_dict`` reads it back by that type) and a README "Report
    JSON schema" row.  One computed from fields the report already holds is ``derived(...)``: nothing else to
    touch.  One a stage makes is also returned by that stage (its dict of fields); a simulated one is a
    ``_DeferrableField`` filled by ``fxremat/partition.py``'s simulation (``PEAK_FIELDS`` follows from this class).
    """

    graph_id: str
    num_joint_nodes: int
    saved_bytes: int
    recompute_flops: int
    est_recompute_seconds: float
    saved: tuple[SavedValue, ...]
    recomputed: tuple[RecomputedNode, ...]
    saved_symbols: tuple[str, ...] = ()
    recompute_reasons: tuple[tuple[str, str], ...] = ()  # (node name, why it is recomputed)
    never_recomputed: tuple[tuple[str, int], ...] = ()  # (reason, how many nodes)
    tag_conflicts: tuple[tuple[str, str], ...] = ()  # (node name, what the tag asked and why safety won)
    # checkpoint regions (fxremat/contract.py): tagged values kept (name, why), and the user's plan's figures
    checkpoint_kept: tuple[tuple[str, str], ...] = ()
    user_plan_saved_bytes: int | None = None
    user_plan_simulated_peak_bytes: int | None = None
    baseline_saved_bytes: int | None = None
    baseline_recompute_flops: int | None = None
    baseline_est_recompute_seconds: float | None = None
    baseline_saved: tuple[SavedValue, ...] = ()
    # PyTorch at activation_memory_budget b: (b, saved bytes, est. recompute seconds); with compare_budgets only
    baseline_budget_points: tuple[tuple[float, int, float], ...] = ()
    baseline_seconds: float | None = None
    baseline_error: str | None = None
    solve_seconds: float = 0.0
    partition_seconds: float = 0.0
    device_profile: str = "cpu"
    memory_price: float = 0.0
    memory_budget: float | int | None = None  # as asked (by fxremat's option, PyTorch's knob or an annotation)
    memory_budget_source: str | None = None  # which: fxremat/knobs.py's sources; None without a budget
    budget_bytes: int | None = None  # the budget resolved to saved bytes for this graph
    budget_met: bool | None = None  # None when no budget was asked
    fewest_saved_bytes: int | None = None  # the fewest-bytes plan's saved bytes (budget runs)
    default_plan_saved_bytes: int | None = None  # fxremat's plan without a budget
    plan_method: str = "mincut"
    # per-region budgets (fxremat/region_plan.py): (region, budget, saved bytes, budget bytes, default plan's bytes,
    # fewest-bytes plan's bytes) per region, the storages outside every region last
    region_budgets: tuple[tuple[str, float | int | None, int, int | None, int, int | None], ...] = ()
    # memory_budget's peak-safe choice (fxremat/peak_choice.py): candidates, of which simulated; and the simulated
    # step-peak bytes the budget itself forced above the lowest peak of any looser budget (0: none)
    budget_candidates: int | None = None
    budget_simulated: int | None = None
    peak_raised_by_budget: int | None = None
    # backward recomputing the forward segment by segment (passes/segments.py): the checkpoints its first pass
    # recomputes, and the FLOPs that costs beyond the plan's own recomputation
    backward_checkpoints: tuple[str, ...] = ()
    segment_recompute_flops: int = 0
    frontier: tuple[tuple[int, float, float], ...] = ()  # (saved bytes, est. recompute s, memory_price) per vertex
    peak_budget: float | int | None = None  # as asked (step peak bytes, or a fraction)
    peak_budget_bytes: int | None = None  # the simulated step peak the plan had to fit
    peak_budget_met: bool | None = None
    peak_candidates: int | None = None  # candidate plans whose peak was estimated
    peak_simulated: int | None = None  # ... and of those, the shortlist judged by simulated peak (unsplit)
    # the layout fxremat handed Inductor for a CPU graph with convolutions ("contiguous" or "channels_last"; None:
    # Inductor's own decision), and the simulated step peaks (contiguous, channels-last) it chose by
    inductor_layout: str | None = None
    layout_simulated_peaks: tuple[int, int] | None = None
    # liveness simulation of the step (passes/liveness.py), computed when first read (_DeferrableField)
    simulated_peak_bytes: int | None = _DeferrableField(None)
    simulated_activation_peak_bytes: int | None = _DeferrableField(None)  # the same, less the gradients
    simulated_peak_at: str | None = _DeferrableField(None)  # "phase:node" where the simulated peak is reached
    memory_timeline: tuple[tuple[str, str, int], ...] = _DeferrableField(())  # (phase, node, bytes live), downsampled
    # the same for PyTorch's default split of the same joint graph
    baseline_simulated_peak_bytes: int | None = _DeferrableField(None)
    baseline_simulated_peak_at: str | None = _DeferrableField(None)
    baseline_memory_timeline: tuple[tuple[str, str, int], ...] = _DeferrableField(())
    fallback_reason: str | None = None
    from_cache: bool = False
    torch_version: str = ""

    def __post_init__(self) -> None:
        for name, compute in DERIVED_FIELDS:
            object.__setattr__(self, name, compute(self))

    def __getstate__(self) -> dict[str, Any]:
        # pickle and deepcopy see computed values, never a Deferred (it holds graphs and a closure)
        for name in DEFERRED_FIELDS:
            getattr(self, name)
        return dict(self.__dict__)

    def pending_fields(self) -> tuple[str, ...]:
        """The deferred fields whose computation has not run yet (reading one runs it)."""
        return tuple(
            name
            for name in DEFERRED_FIELDS
            if isinstance(self.__dict__[f"_{name}"], Deferred) and not self.__dict__[f"_{name}"].done
        )

    def to_dict(self, compute_deferred: bool = True) -> dict[str, Any]:
        """Every field.  ``compute_deferred=False``: a deferred field not computed yet is written as its default
        (null, or an empty list) and stays uncomputed, so writing the report runs no simulation."""
        report = self
        if not compute_deferred:
            pending = self.pending_fields()
            if pending:
                defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in pending}
                report = dataclasses.replace(self, **defaults)
        data = {f.name: _plain(getattr(report, f.name)) for f in dataclasses.fields(report)}
        data["schema_version"] = SCHEMA_VERSION
        return data

    def to_json(self, compute_deferred: bool = True, indent: int | None = 2) -> str:
        """``indent=None``: one line, with Python's C encoder (the report store's copy: 7x faster at 48 blocks)."""
        return json.dumps(self.to_dict(compute_deferred), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CutReport:
        """The report ``to_dict`` wrote: each field's JSON turned back by its declared type
        (``report_fields.decoders``), so a new field needs nothing here.  A key no init field has is dropped (a
        schema 1 report's "extra"; a derived field, made again)."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        values = {}
        for name, decode in decoders(cls):
            if name in data:
                values[name] = decode(data[name])
            elif fields[name].default is dataclasses.MISSING:
                values[name] = decode(())  # a row list left out: none
        values.update((k, v) for k, v in data.items() if k in fields and k not in values)
        return cls(**values)

    def with_changes(self, **changes: Any) -> CutReport:
        return dataclasses.replace(self, **changes)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s conversion of one field (dataclasses to dicts, containers rebuilt), without its deep
    copy of every leaf: a report's leaves are immutable (numbers, strings, None), and its thousands of rows made
    ``asdict`` most of ``to_dict``'s time (15 ms of a 48-block stack's report)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES.get(type(value))
        if names is None:
            names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
        return {name: _plain(getattr(value, name)) for name in names}
    return copy.deepcopy(value)


DEFERRED_FIELDS = tuple(name for name, value in vars(CutReport).items() if isinstance(value, _DeferrableField))
# (name, compute) of each ``derived`` field
DERIVED_FIELDS = tuple((f.name, f.metadata["derive"]) for f in dataclasses.fields(CutReport) if "derive" in f.metadata)


def describe_fields(description: SplitDescription) -> dict[str, Any]:
    return dict(
        saved_bytes=description.saved_bytes,
        recompute_flops=description.recompute_flops,
        est_recompute_seconds=description.recompute_seconds,
        saved=description.saved,
        recomputed=description.recomputed,
        saved_symbols=description.saved_symbols,
    )


def merged_fields(*parts: dict) -> dict:
    """The report's fields, made by several stages, in one dict.  A field two stages both make is a bug of ours:
    an error naming it (inside the partition's fallback), never one value silently over the other."""
    merged: dict = {}
    for part in parts:
        clash = merged.keys() & part.keys()
        if clash:
            raise ValueError(f"report fields made twice: {sorted(clash)}")
        merged.update(part)
    return merged


def never_recomputed_counts(reasons: dict[Any, str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(Counter(reasons.values()).items()))


@dataclass(frozen=True)
class SavedDiff:
    """What fxremat and PyTorch's default partitioner keep differently.  Both sides are named after the joint
    graph's nodes (each split keeps the joint node names), so comparing names compares values."""

    only_fxremat: tuple[SavedValue, ...]
    only_default: tuple[SavedValue, ...]
    both: tuple[str, ...]


def _by_bytes(rows) -> tuple[SavedValue, ...]:
    return tuple(sorted(rows, key=lambda r: (-r.nbytes * r.counted, r.name)))


def diff_default(report: CutReport) -> SavedDiff | None:
    """None when the report has no PyTorch baseline (``compare_default=False``, or the baseline failed)."""
    if report.baseline_saved_bytes is None:
        return None
    ours = {r.name: r for r in report.saved}
    theirs = {r.name: r for r in report.baseline_saved}
    return SavedDiff(
        only_fxremat=_by_bytes(r for name, r in ours.items() if name not in theirs),
        only_default=_by_bytes(r for name, r in theirs.items() if name not in ours),
        both=tuple(sorted(set(ours) & set(theirs))),
    )


# --- formatting ----------------------------------------------------------------------------------------------------


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
    """The simulated step peak (passes/liveness.py) and the node where it is reached, when simulated."""
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
    ]


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
    saved = _by_bytes(report.saved)
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
