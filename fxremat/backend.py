"""The torch.compile backend: Inductor, with fxremat's partitioner plugged in through ``custom_partitioner_fn``.

``FxrematPartitioner.uuid()`` is part of AOTAutograd's and Inductor's cache keys: it hashes our source files and
every option, so changing either never reuses a stale cached partition (a uuid of None does not bypass the
cache).  A warm cache never calls the partitioner, so each report is also stored under a key of the
Dynamo graph and our uuid, and re-emitted on a cache hit.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import inductor_entry
from fxremat_passes._torch_private import scheduler as inductor_scheduler
from fxremat_passes.graph.region_budget import annotation_key
from fxremat_passes.rewrite.layout_choice import LayoutChoice

from .options import Options
from .report import CutReport

if TYPE_CHECKING:  # loaded on the first verified graph: a compile without verify never needs it
    from .verify import Verifier

log = logging.getLogger(__name__)

# fxremat/ and passes/ with every subpackage: every source file a partition runs, so that a changed pass never
# reuses a partition cached before the change
_PACKAGE_DIRS = (Path(__file__).resolve().parent, Path(tp.__file__).resolve().parents[1])
_graph_counter = itertools.count()
_warned_unsupported = False


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    files = sorted(str(p) for d in _PACKAGE_DIRS for p in d.rglob("*.py"))
    return tp.get_hash_for_files(tuple(files)).hex()


def report_store_dir() -> Path:
    """Next to Inductor's own cache, so that reports live exactly as long as the partitions they describe."""
    return inductor_entry.inductor_cache_dir() / "fxremat_reports"


class FxrematPartitioner(tp.CustomPartitionerFn):
    """What Inductor calls with each joint graph."""

    def __init__(self, options: Options, on_report, as_inductor: bool = False) -> None:
        self.options = options
        self._on_report = on_report
        # split as for Inductor even where Inductor is not the compiler (tests that emulate it)
        self.as_inductor = as_inductor
        self.current_key: str | None = None
        # the region budgets of the Dynamo graph being compiled (``region_budget.annotation_key``): AOTAutograd's
        # cache key reads the first node's budget only (one budget per graph in PyTorch), and meta is not hashed
        self.current_regions = ""
        # the compile's layout decision (passes/rewrite/layout_choice.py)
        self.current_layout: LayoutChoice | None = None

    def __deepcopy__(self, memo):
        # Inductor deep-copies its config (which holds us) to hash it; the cache key comes from uuid(), and the
        # copy must still report to the same backend, so a copy is this very object.
        return self

    def __reduce__(self):
        # AOTAutograd pickles the Inductor config to build its cache key (and compile workers may unpickle it):
        # pickle only the options, never the backend that collects reports (it holds a lock).
        return (_rebuild_partitioner, (self.options, self.as_inductor))

    def uuid(self) -> str:
        # a compile whose layout the partitioner chooses must not share cache entries with one whose layout the
        # user fixed (both patch ``layout_optimization=False`` into Inductor's config: passes/rewrite/layout_choice.py)
        choice = "|layout-chosen" if self.current_layout is not None else ""
        text = f"{source_hash()}|{self.options.cache_key()}|{torch.__version__}|{self.current_regions}{choice}"
        return hashlib.sha256(text.encode()).hexdigest()

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs: Any):
        # imported here, not with fxremat: a warm compile (an AOTAutograd cache hit) never partitions, and the
        # partitioner's modules are most of fxremat's import (docs/DESIGN.md §8, warm compiles)
        from .partition import PartitionRequest, partition

        request = PartitionRequest(
            joint=gm,
            joint_inputs=joint_inputs,
            num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
            graph_id=f"graph_{next(_graph_counter)}",
            inductor=self.as_inductor or _compiling_for_fxremat(),
            layout=self.current_layout,
        )
        fw, bw, report = partition(request, self.options)
        self._on_report(report, self.current_key)
        return fw, bw


def _compiling_for_fxremat() -> bool:
    """Whether Inductor is compiling a graph of fxremat's: our partitioner is in its config (``compile_fx``
    re-applies our config patches around the lazy backward lowering too)."""
    return isinstance(inductor_entry.inductor_config_value("custom_partitioner_fn"), FxrematPartitioner)


def _groups_generated_kernels(device_type: str) -> bool:
    """Whether Inductor's backend for ``device_type`` frees what a group of generated kernels read only when the group
    is flushed (the simulator's rules, loaded with the first compile rather than with fxremat)."""
    from fxremat_passes.simulator.backends import backend_for_device

    return backend_for_device(device_type).groups_generated_kernels


def _rebuild_partitioner(options: Options, as_inductor: bool = False) -> FxrematPartitioner:
    return FxrematPartitioner(options, _discard_report, as_inductor)


def _discard_report(report: CutReport, key: str | None) -> None:
    """Where an unpickled partitioner reports: the backend that collected its reports stayed in the other process."""


class PartitionFn:
    """A plain ``partition_fn`` for ``aot_function``/``aot_module`` (tests, tools): no Inductor involved, unless
    ``as_inductor`` (the split Inductor would get, for compilers that emulate it).  Each report is appended to
    ``reports`` (the caller's list).

    Copies, as ``FxrematBackend``'s: ``copy.deepcopy`` shares ``reports`` (a framework that copies its compile
    arguments still fills the caller's list); ``pickle`` keeps the options and starts an empty list of its own."""

    def __init__(self, options: Options, reports: list[CutReport], as_inductor: bool = False) -> None:
        self.options = options
        self.reports = reports
        self.as_inductor = as_inductor
        self._partitioner = FxrematPartitioner(options, self._record, as_inductor)

    def _record(self, report: CutReport, key: str | None) -> None:
        self.reports.append(report)

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs: Any):
        return self._partitioner(gm, joint_inputs, **kwargs)

    def __deepcopy__(self, memo) -> PartitionFn:
        return PartitionFn(self.options, self.reports, self.as_inductor)

    def __reduce__(self):
        return (PartitionFn, (self.options, [], self.as_inductor))


def make_partition_fn(options: Options, sink: list[CutReport], as_inductor: bool = False) -> PartitionFn:
    """A ``partition_fn`` that appends each report to ``sink`` (``PartitionFn``)."""
    return PartitionFn(options, sink, as_inductor)


def _dynamo_graph_key(gm: fx.GraphModule, example_inputs, uuid: str) -> str:
    # grad mode decides whether there is a joint graph at all: an inference compile must not re-emit the report
    # of a training compile of the same code
    parts = [uuid, gm.code, f"grad={torch.is_grad_enabled()}"]
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            parts.append(f"T{tuple(x.shape)}{x.dtype}{x.requires_grad}{tuple(x.stride())}{x.device}")
        else:
            parts.append(repr(type(x)))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def stored_report_json(report: CutReport, options: Options) -> str:
    """The JSON the report store keeps for warm-cache re-emission.  Its deferred fields (the step's simulation) are
    computed only for a report someone asked for (``compare_default``, which ``report_dir`` and ``FXREMAT_COMPARE``
    turn on, or ``report_dir`` itself): otherwise it keeps what the partition computed, and a cache hit re-emits
    null peaks (a ``peak_budget`` plan's simulation is part of choosing it, so its peaks are kept)."""
    return report.to_json(compute_deferred=options.compare_default or options.report_dir is not None, indent=None)


class _ReportSink:
    """Where a backend's reports go: the reports, those not yet written out, and the lock that guards both (Inductor
    may compile on several threads).  Shared by a backend and its deep copies.  ``mirror``: a list that also gets
    every report (the string form's backends share one, ``string_backend_reports``)."""

    def __init__(self, mirror: list[CutReport] | None = None) -> None:
        self.reports: list[CutReport] = []
        self.mirror = mirror
        self.unwritten: list[tuple[CutReport, str | None, int]] = []  # (report, store key, number): _write_reports
        self.lock = threading.Lock()

    def record(self, report: CutReport, key: str | None, to_write: bool = True) -> int:
        """Append ``report``; unless ``to_write`` is False (a report read back from the store), also queue it for
        ``FxrematBackend._write_reports``.  Returns its number (1-based)."""
        with self.lock:
            self.reports.append(report)
            if self.mirror is not None:
                self.mirror.append(report)
            if to_write:
                self.unwritten.append((report, key, len(self.reports)))
            return len(self.reports)

    def take_unwritten(self) -> list[tuple[CutReport, str | None, int]]:
        with self.lock:
            unwritten, self.unwritten = self.unwritten, []
            return unwritten


class FxrematBackend:
    """``torch.compile(model, backend=fxremat.backend(...))``.  ``.reports``: one CutReport per joint graph.

    A backend can be copied and pickled, so that frameworks that copy or re-apply compile arguments (Lightning
    deep-copies them) accept it.  ``copy.copy`` and ``copy.deepcopy`` give a backend with the same options that
    reports to the same place: its reports land in this backend's ``.reports``, so the object you hold sees every
    compile, whichever copy a framework compiled with.  ``pickle`` keeps the options and Inductor patches only: an
    unpickled backend (another process's, say) starts with no reports of its own.
    """

    def __init__(
        self, options: Options, inductor_config: dict[str, Any] | None = None, sink: _ReportSink | None = None
    ) -> None:
        self.options = options
        self.inductor_config = dict(inductor_config or {})
        self._sink = sink if sink is not None else _ReportSink()
        self._partitioner = FxrematPartitioner(options, self._record)
        # looked up at each call, so that a test can tell the fix which compiles to mend
        inductor_scheduler.inductor_keeps_mutation_order(lambda: _compiling_for_fxremat())
        inductor_scheduler.inductor_vetoes_dragging_fusions(lambda: _compiling_for_fxremat())
        tp.inductor_bounds_reuse_by_allocated_buffers(lambda: _compiling_for_fxremat(), _groups_generated_kernels)
        self._verifier: Verifier | None = None  # made on the first verified graph (options.verify)

    @property
    def reports(self) -> list[CutReport]:
        """One CutReport per joint graph compiled through this backend or a copy of it, in compile order."""
        return self._sink.reports

    def __repr__(self) -> str:
        return f"fxremat.backend({self.options})"

    def __copy__(self) -> FxrematBackend:
        return FxrematBackend(self.options, self.inductor_config, self._sink)

    def __deepcopy__(self, memo) -> FxrematBackend:
        return FxrematBackend(self.options, copy.deepcopy(self.inductor_config, memo), self._sink)

    def __reduce__(self):
        return (FxrematBackend, (self.options, self.inductor_config))

    def _record(self, report: CutReport, key: str | None) -> None:
        self._sink.record(report, key)

    def _write_reports(self) -> None:
        """Write the reports of this compile's partitions to the report store (``stored_report_json``: deferred
        fields only when asked for) and ``report_dir`` (full reports), once Inductor is done, so that whatever
        they compute runs outside the partition."""
        for report, key, number in self._sink.take_unwritten():
            if key is not None:
                try:
                    path = report_store_dir() / f"{key}.json"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(stored_report_json(report, self.options))
                except OSError as error:  # a report must never break training
                    log.warning("fxremat: could not store report: %s", error)
            self._write_report_dir(report, number)

    def _write_report_dir(self, report: CutReport, number: int) -> None:
        if not self.options.report_dir:
            return
        try:
            directory = Path(self.options.report_dir)
            directory.mkdir(parents=True, exist_ok=True)
            name = f"{report.graph_id}-{os.getpid()}-{number}.json"
            (directory / name).write_text(report.to_json())
        except OSError as error:
            warnings.warn(f"fxremat: could not write report to {self.options.report_dir}: {error}", stacklevel=2)

    def __call__(self, gm: fx.GraphModule, example_inputs, **kwargs: Any):
        global _warned_unsupported
        reason = tp.unsupported_torch_reason()
        if reason is not None:
            if not _warned_unsupported:
                warnings.warn(reason, stacklevel=2)
                _warned_unsupported = True
            return inductor_entry.compile_fx(gm, example_inputs, config_patches=self.inductor_config or None)
        self._partitioner.current_regions = annotation_key(gm)
        layout_patches = self._layout_patches(example_inputs)
        # where fxremat lays the graph out, its partitioner decides how, per graph (passes/rewrite/layout_choice.py)
        layout = self._partitioner.current_layout = LayoutChoice() if layout_patches else None
        key = _dynamo_graph_key(gm, example_inputs, self._partitioner.uuid())
        before = len(self.reports)
        self._partitioner.current_key = key
        patches = {**layout_patches, **self.inductor_config}
        patches["custom_partitioner_fn"] = self._partitioner
        inner = {} if layout is None else {"inner_compile": tp.inner_compile_with_layout(layout)}
        # the eager reference of verify: a copy, since Inductor's pre-grad passes rewrite gm in place
        reference = tp.copy_graph_module(gm) if self.options.verify else None
        try:
            # what the simulator must replay of Inductor's buffer reuse (_torch_private/buffer_reuse.py)
            with tp.fxremat_buffer_reuse(self.inductor_config):
                compiled = inductor_entry.compile_fx(gm, example_inputs, config_patches=patches, **inner)
        finally:
            self._partitioner.current_key, self._partitioner.current_regions = None, ""
            self._partitioner.current_layout = None
            self._write_reports()
        if len(self.reports) == before:
            self._reemit_cached_report(key)
        if reference is None:
            return compiled
        # here, around what Inductor returns, so that a warm cache hit (no partition) is verified too
        if self._verifier is None:
            from .verify import Verifier

            self._verifier = Verifier()
        return self._verifier.wrap(compiled, reference, self._graph_name(gm, self.reports[before:]))

    def _layout_patches(self, example_inputs) -> dict[str, Any]:
        """Inductor's layout optimisation off for a graph whose tensors are all on the CPU, unless the user chose
        (``inductor_options`` or ``torch._inductor.config`` names a layout switch: honoured as set).

        Why (docs/DESIGN.md §7): on the CPU Inductor lays every graph with a convolution out channels-last
        (``GraphLowering.decide_layout_opt``), so each convolution weight is copied to channels-last in forward, and
        again in backward or kept from forward.  Left contiguous, mkldnn reads the parameters as they are: a lower step
        peak and a faster step on weight-heavy nets, and mkldnn's large depthwise buffer never arises.  Contiguous is
        where a compile starts: the partitioner lays a graph out channels-last instead where that simulates a lower step
        peak (``passes/rewrite/layout_choice.py``: nets whose activations dwarf their weights). On a GPU Inductor's
        choice stands (cuDNN's channels-last kernels; not measured here)."""
        if any(name in self.inductor_config for name in tp.LAYOUT_SWITCHES):
            return {}
        if not tp.inductor_layout_switches_at_default():
            return {}
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        if not tensors or any(x.device.type != "cpu" for x in tensors):
            return {}
        return {"layout_optimization": False}

    @staticmethod
    def _graph_name(gm: fx.GraphModule, reports: list[CutReport]) -> str:
        """Dynamo's id of the graph (as TORCH_LOGS prints it), and the graph_id of its fxremat report."""
        name = f"Dynamo graph {gm.meta.get('dynamo_compile_id', '?')}"
        ids = ", ".join(r.graph_id for r in reports)
        return f"{name} (fxremat {ids})" if ids else name

    def _reemit_cached_report(self, key: str) -> None:
        """A warm compile cache skipped the partitioner: re-emit the report stored when it did run."""
        path = report_store_dir() / f"{key}.json"
        if not path.exists():
            return  # an inference graph, or a graph without backward: no joint graph, no report
        try:
            report = CutReport.from_dict(json.loads(path.read_text())).with_changes(from_cache=True)
        except (OSError, ValueError, TypeError) as error:
            log.warning("fxremat: stored report %s unreadable: %s", path, error)
            return
        self._write_report_dir(report, self._sink.record(report, key, to_write=False))


def backend(inductor_options: dict[str, Any] | None = None, **options: Any) -> FxrematBackend:
    """A configured fxremat backend: ``torch.compile(model, backend=fxremat.backend(memory_price=20))``.

    Options (see ``fxremat.Options``): memory_budget, peak_budget, memory_price, device, solver, compare_default,
    compare_budgets, strict, report_dir, verify, loss_chunks.  Bad values raise ValueError/TypeError here, naming
    what is allowed.
    ``inductor_options``: Inductor config patches for fxremat's compiles, as ``torch.compile``'s ``options``
    (e.g. ``{"max_autotune": True}``; the simulator follows ``allow_buffer_reuse`` set here: DESIGN §6).
    """
    inductor = dict(inductor_options or {})
    known = _inductor_config_names()
    unknown = sorted(k for k in inductor if known and k not in known)
    if unknown:
        raise ValueError(f"inductor_options: {unknown} are not Inductor config names (torch._inductor.config)")
    return FxrematBackend(Options.create(**options), inductor)


_string_backends: dict[str, FxrematBackend] = {}
_string_reports: list[CutReport] = []  # every string-form backend's reports, in compile order


def _inductor_config_names() -> set[str]:
    return inductor_entry.inductor_config_names()


def backend_from_compile_args(mode: str | None = None, options: dict[str, Any] | None = None) -> FxrematBackend:
    """What ``torch.compile(model, backend="fxremat", mode=..., options={...})`` means: keys of ``options`` that
    are fxremat options configure fxremat; the rest are Inductor config patches, as with backend="inductor"."""
    import dataclasses

    options = dict(options or {})
    ours = {f.name for f in dataclasses.fields(Options)}
    fx_opts = {k: v for k, v in options.items() if k in ours}
    inductor = {k: v for k, v in options.items() if k not in ours}
    known_inductor = _inductor_config_names()
    unknown = sorted(k for k in inductor if known_inductor and k not in known_inductor)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for backend='fxremat'; fxremat options are {sorted(ours)}, "
            "anything else must be an Inductor config name"
        )
    if mode is not None:
        inductor = {**inductor_entry.inductor_mode_options(mode), **inductor}
    key = repr((mode, sorted(options.items(), key=lambda kv: kv[0])))
    if key not in _string_backends:
        _string_backends[key] = FxrematBackend(Options.create(**fx_opts), inductor, _ReportSink(_string_reports))
    return _string_backends[key]


def fxremat_backend(gm: fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """The ``torch_dynamo_backends`` entry point behind ``torch.compile(model, backend="fxremat")``."""
    return backend_from_compile_args(mode, options)(gm, example_inputs)


def string_backend_reports() -> list[CutReport]:
    """Reports of every graph compiled through ``backend="fxremat"`` in this process, whatever its ``options=``, in
    compile order (a run's reports are the list's end)."""
    return list(_string_reports)  # the sinks append to it under their own locks; list.append is atomic
