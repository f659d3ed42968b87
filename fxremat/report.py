"""CutReport: what fxremat chose for one joint graph, as data only (its renderings: ``fxremat/render/``).

Each stage returns a record of the report fields it makes (``STAGE_RECORDS``); ``build_report`` joins them, the one
place a report is assembled.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fxremat_passes.rewrite.describe import RecomputedNode, SavedValue, SplitDescription

from .deferred import Deferred, _DeferrableField
from .report_fields import decoders, derived  # noqa: F401 (derived: for a derived field, docs/examples)

# to_dict's "schema_version": it changes only when a key changes meaning or goes away (docs/REPORT.md, "Report JSON
# schema").
# 2: "extra" (an always-empty object that nothing filled) removed.
SCHEMA_VERSION = 2


# Each stage's record: frozen, keyword-only, its field names CutReport's.  ``CutReport`` is composed of them (below),
# so a field a stage makes is declared once, in its stage's record, and from_dict/to_dict/DEFERRED_FIELDS follow.
_RECORD = dict(frozen=True, kw_only=True)


@dataclass(**_RECORD)
class CompileFacts:
    """What the compile itself says (``partition._partition``)."""

    graph_id: str
    num_joint_nodes: int
    device_profile: str = "cpu"
    memory_price: float = 0.0
    memory_budget: float | int | None = None  # as asked (by fxremat's option, PyTorch's knob or an annotation)
    memory_budget_source: str | None = None  # which: fxremat/knobs.py's sources; None without a budget
    torch_version: str = ""


@dataclass(**_RECORD)
class Described:
    """The split handed on (ours or the fallback's), as ``passes/rewrite/describe.py`` describes it.

    ``saved_bytes``: activation bytes kept for backward (distinct storages, graph inputs excluded)."""

    saved_bytes: int
    recompute_flops: int
    est_recompute_seconds: float
    saved: tuple[SavedValue, ...]
    recomputed: tuple[RecomputedNode, ...]
    saved_symbols: tuple[str, ...] = ()
    # the step's estimate by the same model (``describe.step_seconds``): computed when first read
    est_step_seconds: float | None = _DeferrableField(None)

    @classmethod
    def of(cls, description: SplitDescription, est_step_seconds=None) -> Described:
        # the description's fields under the same names, but its estimate, which the report calls est_*
        same = {f.name: getattr(description, f.name) for f in dataclasses.fields(cls) if hasattr(description, f.name)}
        return cls(**same, est_recompute_seconds=description.recompute_seconds, est_step_seconds=est_step_seconds)


@dataclass(**_RECORD)
class Classified:
    """What classification (``passes/graph/roles.py``) kept from recomputation."""

    never_recomputed: tuple[tuple[str, int], ...] = ()  # (reason, how many nodes)
    tag_conflicts: tuple[tuple[str, str], ...] = ()  # (node name, what the tag asked and why safety won)


@dataclass(**_RECORD)
class LossRegions:
    """The loss regions ``loss_chunks`` looked at (``passes/rewrite/loss_chunks.py``, docs/DESIGN.md §14)."""

    # (the LM head's projection node, tokens, vocabulary, chunks: 0 where left as traced, why it was left or None,
    # the chunked form: "forward" (gradients in forward), "backward" (the logits returned), None where left as traced)
    loss_regions: tuple[tuple[str, int, int, int, str | None, str | None], ...] = ()
    # each count of chunks tried (0: as traced, as in ``loss_regions``; 1 is one chunk), its plan's simulated step
    # peak and estimated step seconds, in the order tried; empty where no region could be chunked
    loss_chunks_tried: tuple[tuple[int, int, float], ...] = ()
    # what no count goes below: the gradients backward returns at once (the parameters') and, where the logits are
    # returned, the logits and their gradient; None where nothing was tried
    loss_peak_floor_bytes: int | None = None


@dataclass(**_RECORD)
class Recomputation:
    """Why the chosen plan recomputes each forward node, and the checkpointed values it keeps
    (``passes/choice/contract.py``)."""

    recompute_reasons: tuple[tuple[str, str], ...] = ()  # (node name, why it is recomputed)
    checkpoint_kept: tuple[tuple[str, str], ...] = ()  # tagged values kept (name, why)


@dataclass(**_RECORD)
class Choice:
    """The plan choice's figures (``passes/choice/``: ``PlanChoice.fields``)."""

    solve_seconds: float = 0.0
    # checkpoint regions (passes/choice/contract.py): the user's plan's figures
    user_plan_saved_bytes: int | None = None
    user_plan_simulated_peak_bytes: int | None = None
    budget_bytes: int | None = None  # the budget resolved to saved bytes for this graph
    budget_met: bool | None = None  # None when no budget was asked
    fewest_saved_bytes: int | None = None  # the fewest-bytes plan's saved bytes (budget runs)
    default_plan_saved_bytes: int | None = None  # fxremat's plan without a budget
    plan_method: str = "mincut"
    # per-region budgets (passes/choice/regions.py): (region, budget, saved bytes, budget bytes, default plan's bytes,
    # fewest-bytes plan's bytes) per region, the storages outside every region last
    region_budgets: tuple[tuple[str, float | int | None, int, int | None, int, int | None], ...] = ()
    # memory_budget's peak-safe choice (passes/choice/memory_budget.py): candidates, of which simulated; and the
    # simulated step-peak bytes the budget itself forced above the lowest peak of any looser budget (0: none)
    budget_candidates: int | None = None
    budget_simulated: int | None = None
    peak_raised_by_budget: int | None = None
    # backward recomputing the forward segment by segment (passes/rewrite/segments.py): the checkpoints its first pass
    # recomputes, and the FLOPs that costs beyond the plan's own recomputation
    backward_checkpoints: tuple[str, ...] = ()
    segment_recompute_flops: int = 0
    frontier: tuple[tuple[int, float, float], ...] = ()  # (saved bytes, est. recompute s, memory_price) per vertex
    peak_budget: float | int | None = None  # as asked (step peak bytes, or a fraction)
    peak_budget_bytes: int | None = None  # the simulated step peak the plan had to fit
    peak_budget_met: bool | None = None
    peak_candidates: int | None = None  # candidate plans whose peak was estimated
    peak_simulated: int | None = None  # ... and of those, the shortlist judged by simulated peak (unsplit)
    # offload under peak_budget (passes/choice/offload.py, docs/DESIGN.md §16): (storage, bytes, exposed seconds,
    # the forward node its wait precedes or "" for the forward's end, the backward node its reload precedes) per
    # offloaded storage, the simulated step peak with them on the host, their exposed seconds summed
    offloaded: tuple[tuple[str, int, float, str, str], ...] = ()
    offload_peak_bytes: int | None = None
    offload_exposed_seconds: float | None = None


@dataclass(**_RECORD)
class Baseline:
    """PyTorch's default ``min_cut_rematerialization_partition`` of a copy of the same joint graph
    (``partition._baseline``): every field None or empty when ``compare_default=False`` or when it failed."""

    baseline_saved_bytes: int | None = None
    baseline_recompute_flops: int | None = None
    baseline_est_recompute_seconds: float | None = None
    baseline_saved: tuple[SavedValue, ...] = ()
    # PyTorch at activation_memory_budget b: (b, saved bytes, est. recompute seconds); with compare_budgets only
    baseline_budget_points: tuple[tuple[float, int, float], ...] = ()
    baseline_seconds: float | None = None
    baseline_error: str | None = None
    # the liveness simulation of PyTorch's split, as SimulatedPeak's (no activation peak)
    baseline_simulated_peak_bytes: int | None = _DeferrableField(None)
    baseline_simulated_peak_at: str | None = _DeferrableField(None)
    baseline_memory_timeline: tuple[tuple[str, str, int], ...] = _DeferrableField(())


@dataclass(**_RECORD)
class SimulatedPeak:
    """The liveness simulation of our split's step (``passes/simulator/liveness.py``), computed when first read."""

    simulated_peak_bytes: int | None = _DeferrableField(None)
    simulated_activation_peak_bytes: int | None = _DeferrableField(None)  # the same, less the gradients
    simulated_peak_at: str | None = _DeferrableField(None)  # "phase:node" where the simulated peak is reached
    # what the caller's own work (an eager loss on the outputs) holds between forward and backward, as simulated
    simulated_caller_bytes: int | None = _DeferrableField(None)
    memory_timeline: tuple[tuple[str, str, int], ...] = _DeferrableField(())  # (phase, node, bytes live), downsampled


@dataclass(**_RECORD)
class Layout:
    """The layout fxremat handed Inductor for a CPU graph with convolutions (``passes/rewrite/layout_choice.py``)."""

    inductor_layout: str | None = None  # "contiguous" or "channels_last"; None: Inductor's own decision
    layout_simulated_peaks: tuple[int, int] | None = None  # the simulated step peaks (contiguous, channels-last)


@dataclass(**_RECORD)
class Outcome:
    """How the report came to be: the partition's time, its fallback, the compile cache (``fxremat/backend.py``)."""

    partition_seconds: float = 0.0
    fallback_reason: str | None = None  # None unless fxremat fell back to PyTorch's partitioner for this graph
    from_cache: bool = False


STAGE_RECORDS = (
    CompileFacts,
    Described,
    Classified,
    LossRegions,
    Recomputation,
    Choice,
    Baseline,
    SimulatedPeak,
    Layout,
    Outcome,
)


def _declared_once(records: tuple[type, ...]) -> tuple[type, ...]:
    """``records``, refused where two declare one field (a dataclass base would silently win over the other)."""
    names = Counter(f.name for record in records for f in dataclasses.fields(record))
    twice = sorted(name for name, count in names.items() if count > 1)
    if twice:
        raise TypeError(f"report fields declared by two stage records: {twice}")
    return records


@dataclass(frozen=True, kw_only=True)
class CutReport(*_declared_once(STAGE_RECORDS)):
    """One compiled joint graph: every stage record's fields (``STAGE_RECORDS``), made by ``build_report``.

    The simulated-peak fields (``DEFERRED_FIELDS``) are computed when first read, not while partitioning: until
    then the report holds what the simulation needs (the joint graph and the split's recipe).

    A new field a stage makes: declare it with its type in that stage's record above (``from_dict`` reads it back
    by that type; a simulated one is a ``_DeferrableField``, and ``PEAK_FIELDS`` follows), set it where the stage
    makes it, and add a docs/REPORT.md "Report JSON schema" row.  One computed from fields the report already holds is
    ``derived(...)``, declared here: nothing else to touch.  Renderers (``fxremat/render/``) read fields by name.
    """

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
        data = {name: _plain(value) for name, value in self._fields(compute_deferred).items()}
        data["schema_version"] = SCHEMA_VERSION
        return data

    def _fields(self, compute_deferred: bool) -> dict[str, Any]:
        """Every field's value as it is (see ``to_dict``)."""
        report = self
        if not compute_deferred:
            pending = self.pending_fields()
            if pending:
                defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in pending}
                report = dataclasses.replace(self, **defaults)
        return {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}

    def to_json(self, compute_deferred: bool = True, indent: int | None = 2) -> str:
        """``to_dict`` as JSON.  ``indent=None``: one line, with Python's C encoder (the report store's copy, on
        deep graphs).  The encoder walks the fields' tuples, lists and dicts itself and asks ``_json_row``
        only for each dataclass row: the same text as encoding ``to_dict()``, without rebuilding thousands of rows
        as dicts first."""
        data = {**self._fields(compute_deferred), "schema_version": SCHEMA_VERSION}
        return json.dumps(data, indent=indent, sort_keys=True, default=_json_row)

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
        """A copy with ``changes``; a deferred field not computed yet stays so (the copy shares its computation)."""
        kept = {f.name: given(self, f.name) for f in dataclasses.fields(self) if f.init and f.name not in changes}
        return type(self)(**kept, **changes)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s conversion of one field (dataclasses to dicts, containers rebuilt), without its deep
    copy of every leaf: a report's leaves are immutable (numbers, strings, None), and its thousands of rows made
    ``asdict``'s copies most of ``to_dict``'s time on deep graphs."""
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


def _json_row(value: Any) -> Any:
    """A dataclass row as ``_plain`` makes it, one level: its fields as a dict (the encoder converts their values).
    Anything else JSON cannot encode, ``_plain`` leaves as it is, so encoding ``to_dict()`` fails on it too."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES.get(type(value))
        if names is None:
            names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
        return {name: getattr(value, name) for name in names}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@functools.cache
def _deferrable(record: type, name: str) -> bool:
    return isinstance(inspect.getattr_static(record, name, None), _DeferrableField)


DEFERRED_FIELDS = tuple(f.name for f in dataclasses.fields(CutReport) if _deferrable(CutReport, f.name))
# the deferred fields of our split's simulation, and of PyTorch's split's (fxremat/partition.py fills each in one go)
PEAK_FIELDS = tuple(f.name for f in dataclasses.fields(SimulatedPeak))
BASELINE_PEAK_FIELDS = tuple(f.name for f in dataclasses.fields(Baseline) if _deferrable(Baseline, f.name))
# the deferred field that prices the step (fxremat/partition.py ``_step_seconds``): no simulation
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Described) if _deferrable(Described, f.name))
# (name, compute) of each ``derived`` field
DERIVED_FIELDS = tuple((f.name, f.metadata["derive"]) for f in dataclasses.fields(CutReport) if "derive" in f.metadata)


def given(record: Any, name: str) -> Any:
    """The value ``record`` (a stage record or a report) holds for field ``name``: a deferred field's ``Deferred``
    as it is, not computed."""
    return record.__dict__[f"_{name}"] if _deferrable(type(record), name) else getattr(record, name)


def build_report(*records: Any) -> CutReport:
    """The report from its stages' records: the one place a report is assembled.  A field two records both carry
    is a bug of ours: an error naming it (raised inside the partition's fallback), never one value silently over
    the other."""
    fields: dict[str, Any] = {}
    for record in records:
        part = {f.name: given(record, f.name) for f in dataclasses.fields(record)}
        clash = fields.keys() & part.keys()
        if clash:
            raise ValueError(f"report fields made twice: {sorted(clash)}")
        fields.update(part)
    return CutReport(**fields)


@dataclass(frozen=True)
class SavedDiff:
    """What fxremat and PyTorch's default partitioner keep differently.  Both sides are named after the joint
    graph's nodes (each split keeps the joint node names), so comparing names compares values."""

    only_fxremat: tuple[SavedValue, ...]
    only_default: tuple[SavedValue, ...]
    both: tuple[str, ...]


def saved_by_bytes(rows) -> tuple[SavedValue, ...]:
    return tuple(sorted(rows, key=lambda r: (-r.nbytes * r.counted, r.name)))


def diff_default(report: CutReport) -> SavedDiff | None:
    """None when the report has no PyTorch baseline (``compare_default=False``, or the baseline failed)."""
    if report.baseline_saved_bytes is None:
        return None
    ours = {r.name: r for r in report.saved}
    theirs = {r.name: r for r in report.baseline_saved}
    return SavedDiff(
        only_fxremat=saved_by_bytes(r for name, r in ours.items() if name not in theirs),
        only_default=saved_by_bytes(r for name, r in theirs.items() if name not in ours),
        both=tuple(sorted(set(ours) & set(theirs))),
    )
