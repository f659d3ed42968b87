"""Recording compiles for replay on another machine: ``with fxremat.recording.recording() as recorder:`` around
the compiling step, and every joint graph a partitioner receives meanwhile is written down as it came (``graph_record``:
its nodes, values and the meta partitioners read), with the partition request's facts, the config in force, the
device profile and simulator inputs fxremat used, the plan chosen, and the kernels Inductor then emitted for each
graph (``_torch_private/recording.py``), in order.  ``benchmarks/gpu_check.py`` records a GPU run this way;
``fxremat/replay.py`` partitions and simulates the recorded graphs again anywhere (docs/DESIGN.md §15).

Off by default and free when off: the partition asks ``current()`` (a module global, None) once per graph, and
the scheduler hook is installed on the first recording only.  PyTorch's own partitioner is recorded where it is
plugged in as ``RecordedPyTorchPartitioner`` (the same function and arguments ``compile_fx`` calls by default).
A warm compile cache never partitions, so a recording should run with a fresh Inductor cache
(``_torch_private.fresh_inductor_cache``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import inductor_entry
from fxremat_passes._torch_private import recording as tp_recording
from fxremat_passes.graph.costs import PROFILES, DeviceProfile
from fxremat_passes.graph.gemm_rates import GemmModel
from fxremat_passes.rewrite.describe import describe_split

from . import graph_record
from .options import Options

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
# Options that change no partition and are not recorded (where reports go, whether plans are verified)
_NOT_RECORDED = ("device", "report_dir", "verify")

_active: Recorder | None = None


def current() -> Recorder | None:
    """The recorder of the ``recording`` in force, or None (the partition's one question)."""
    return _active


def _schedule_sink():
    recorder = _active
    return None if recorder is None else recorder.scheduled


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record every partition and Inductor schedule meanwhile (module docstring); one recording at a time."""
    global _active
    if _active is not None:
        raise RuntimeError("fxremat: a recording is already in force; recordings do not nest")
    tp_recording.record_inductor_schedules(_schedule_sink)
    _active = recorder = Recorder()
    try:
        yield recorder
    finally:
        _active = None


def profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    return dataclasses.asdict(profile)


def profile_from_dict(data: dict[str, Any]) -> DeviceProfile:
    """The ``DeviceProfile`` ``profile_to_dict`` wrote (its tables as tuples again)."""
    gemm = data.get("gemm")
    if gemm is not None:
        gemm = GemmModel(**{**gemm, "rate_by_dtype": tuple(tuple(r) for r in gemm["rate_by_dtype"])})
    table = tuple(tuple(r) for r in data["peak_flops_by_dtype"])
    link = data.get("host_link_bandwidth")  # absent from a recording made before the host link
    return DeviceProfile(data["name"], table, data["mem_bandwidth"], gemm, link)


def options_to_dict(options: Options) -> dict[str, Any]:
    """The options that change a partition, but the device (recorded as the profile it resolved to)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name not in _NOT_RECORDED}


def simulator_to_dict(inputs) -> dict[str, Any]:
    """A ``SimulatorInputs`` as plain data: every field as it is, the backend by name and the torch release its
    rules describe (a field added to ``SimulatorInputs`` is recorded without a change here)."""
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs) if f.name != "backend"}
    return dict(fields, backend=inputs.backend.name, backend_torch=list(inputs.backend.torch_version))


def plan_of(saved, recomputed, saved_symbols=()) -> dict[str, list[str]]:
    """A plan as names (a report's or a ``SplitDescription``'s rows): what two plans are compared by."""
    return dict(
        saved=sorted(r.name for r in saved),
        saved_symbols=sorted(saved_symbols),
        recomputed=sorted(r.name for r in recomputed),
    )


class Recorder:
    """What one recording collects: ``graphs``, one entry per joint graph partitioned, in order, each with the
    schedules Inductor emitted after it (forward, then backward).  ``to_data()`` gives plain JSON data."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, Any]] = []
        self.unattached: list[dict[str, Any]] = []  # schedules of graphs no partition preceded (inference graphs)

    def received(self, partitioner: str, joint: fx.GraphModule, num_fwd_outputs: int, static_indices, **facts):
        """A joint graph as a partitioner received it, before any pass touches it."""
        entry: dict[str, Any] = dict(
            partitioner=partitioner,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=None if static_indices is None else list(static_indices),
            torch=torch.__version__,
            config=tp_recording.config_snapshot(),
            schedules=[],
            **facts,
        )
        try:
            entry["joint"] = graph_record.graph_to_dict(joint)
        except graph_record.UnrecordableGraph as error:
            entry["joint"], entry["unrecorded"] = None, str(error)
            log.warning("fxremat: joint graph not recorded: %s", error)
        entry["received_at"] = time.perf_counter()
        self.graphs.append(entry)

    def fxremat_received(self, request, options: Options, profile: DeviceProfile, simulator) -> None:
        """fxremat's partition of ``request`` is about to start (``fxremat/partition.py``)."""
        self.received(
            "fxremat",
            request.joint,
            request.num_fwd_outputs,
            request.static_lifetime_input_indices,
            graph_id=request.graph_id,
            inductor=request.inductor,
            layout_chosen=request.layout is not None,
            options=options_to_dict(options),
            profile=profile_to_dict(profile),
            simulator=simulator_to_dict(simulator),
        )

    def fxremat_partitioned(self, report) -> None:
        entry = self.graphs[-1]
        entry["partition_seconds"] = time.perf_counter() - entry.pop("received_at")
        entry["plan"] = plan_of(report.saved, report.recomputed, report.saved_symbols)
        entry["report_object"] = report  # its deferred fields are read in ``to_data``, after the compile

    def pytorch_partitioned(self, fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> None:
        entry = self.graphs[-1]
        entry["partition_seconds"] = time.perf_counter() - entry.pop("received_at")
        described = describe_split(fw, bw, num_fwd_outputs, PROFILES["cpu"])  # names only: any profile
        entry["plan"] = plan_of(described.saved, described.recomputed, described.saved_symbols)
        entry["saved_bytes"] = described.saved_bytes

    def scheduled(self, kernels: dict[str, Any]) -> None:
        (self.graphs[-1]["schedules"] if self.graphs else self.unattached).append(kernels)

    def to_data(self) -> dict[str, Any]:
        """Every entry as plain JSON data; a fxremat report's deferred fields (its simulated peaks) computed now."""
        graphs = []
        for entry in self.graphs:
            entry = {k: v for k, v in entry.items() if k != "received_at"}
            report = entry.pop("report_object", None)
            if report is not None:
                entry["report"] = json.loads(report.to_json(compute_deferred=True, indent=None))
            graphs.append(entry)
        return dict(schema_version=SCHEMA_VERSION, graphs=graphs, unattached_schedules=self.unattached)


class RecordedPyTorchPartitioner(tp.CustomPartitionerFn):
    """PyTorch's partitioner, ``min_cut_rematerialization_partition`` at ``activation_memory_budget=budget``, with
    the arguments ``compile_fx`` gives it when no custom partitioner is set: plugged in as Inductor's
    ``custom_partitioner_fn``, it partitions as stock Inductor does and, inside a ``recording``, records the joint
    graph and the split."""

    def __init__(self, budget: float = 1.0) -> None:
        self.budget = float(budget)

    def uuid(self) -> str:
        return f"fxremat.recording.RecordedPyTorchPartitioner(budget={self.budget})"

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs: Any):
        recorder = _active
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices")
        if recorder is not None:
            recorder.received("pytorch", gm, num_fwd_outputs, static, memory_budget=self.budget)
        fw, bw = tp.pytorch_default_partition(
            gm,
            joint_inputs,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static,
            activation_memory_budget=self.budget,
        )
        if recorder is not None:
            recorder.pytorch_partitioned(fw, bw, num_fwd_outputs)
        return fw, bw


def pytorch_backend(budget: float = 1.0):
    """A ``torch.compile`` backend: Inductor with PyTorch's partitioner at ``activation_memory_budget=budget`` as
    ``RecordedPyTorchPartitioner`` (stock Inductor's partition, recorded inside a ``recording``).  A new function
    per call: Dynamo keeps one compiled graph per backend object."""
    partitioner = RecordedPyTorchPartitioner(budget)

    def inductor(gm, example_inputs):
        return inductor_entry.compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": partitioner})

    return inductor
