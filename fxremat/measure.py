"""Independent measurements of a training step (not taken from our own report): saved bytes through
``torch.autograd.graph.saved_tensors_hooks``, and gradient comparisons with a tolerance scaled to each gradient.

Used by the tests, the demo and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SavedTensors:
    count: int
    nbytes: int  # distinct storages, graph inputs excluded
    input_count: int  # saved tensors whose storage belongs to an excluded input


def measure_saved(step_forward: Callable[[], object], exclude: Iterable[torch.Tensor]) -> tuple[object, SavedTensors]:
    """Run ``step_forward()`` under saved-tensor hooks; count what autograd keeps for backward.

    Saved bytes are the distinct storages of the packed tensors, excluding the storages of ``exclude``
    (parameters, buffers, inputs): the same definition as ``CutReport.saved_bytes``.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude if isinstance(t, torch.Tensor)}
    seen: dict[int, int] = {}
    count = 0
    inputs = 0

    def pack(t: torch.Tensor):
        nonlocal count, inputs
        count += 1
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in excluded:
            inputs += 1
        elif ptr not in seen:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step_forward()
    return out, SavedTensors(count=count, nbytes=sum(seen.values()), input_count=inputs)


def max_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|: a mean loss makes gradients ~1e-3, where a fixed atol passes
    anything, so every comparison is scaled to the gradient's own magnitude."""
    scale = expected.detach().abs().max().item()
    diff = (actual.detach() - expected.detach()).abs().max().item()
    if scale == 0.0:
        return diff
    return diff / scale


def gradient_errors(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative error of each parameter's ``.grad`` against ``reference[name]``."""
    errors = {}
    for name, p in model.named_parameters():
        if name in reference:
            if p.grad is None:
                errors[name] = float("inf")
            else:
                errors[name] = max_relative_error(p.grad, reference[name])
    return errors


# --- peak memory of one step (CPU profiler memory events, or CUDA allocator statistics) ---------------------


def peak_from_memory_events(events: Iterable[tuple[int, int]]) -> int:
    """Largest running total of (time, +bytes allocated / -bytes freed) events, in time order, from 0 at the start.

    Memory that existed before the window and is freed inside it drives the total below 0; that is right: the
    peak is the most memory the window held above what it started with, as CUDA's max minus start-allocated is.
    """
    total = peak = 0
    for _, nbytes in sorted(events, key=lambda e: e[0]):
        total += nbytes
        peak = max(peak, total)
    return peak


def cpu_memory_events(prof) -> list[tuple[int, int]]:
    """The ``[memory]`` events of a finished ``torch.profiler.profile(profile_memory=True)`` on CPU, as
    (start ns, signed bytes).  In torch 2.13 these are in ``prof.profiler.kineto_results.events()``, with
    ``nbytes()`` negative for a free; ``prof.events()`` has them too but with microsecond, float timestamps."""
    events = []
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU:
            events.append((event.start_ns(), event.nbytes()))
    return events


def cpu_peak_bytes(fn: Callable[[], Any]) -> int:
    """The peak of ``fn()`` above what was live at its start, from the profiler's memory events.  Garbage is
    collected first and the collector held off during ``fn``: a collection inside the window would free memory
    unrelated to ``fn`` (tensors of earlier compilations) and lower the measured peak by their size."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        if enabled:
            gc.enable()
    return peak_from_memory_events(cpu_memory_events(prof))


def cuda_peak_bytes(fn: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def step_peak_bytes(fn: Callable[[], Any], device: str) -> tuple[int, str]:
    if device == "cuda":
        return cuda_peak_bytes(fn), "cuda_max_memory_allocated"
    return cpu_peak_bytes(fn), "cpu_profiler_memory_events"


# --- time of one call on a device ---------------------------------------------------------------------------------


def device_seconds(fn: Callable[[], Any], device_type: str) -> float:
    """Seconds ``fn`` takes: by CUDA events on a GPU (the kernels' own time on the device, not the host's launch
    time), by the wall clock on CPU."""
    if device_type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    import time

    began = time.perf_counter()
    fn()
    return time.perf_counter() - began
