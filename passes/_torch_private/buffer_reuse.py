"""Inductor's buffer reuse (the wrapper's memory planning, ``allow_buffer_reuse``) in fxremat's compiles.

Inductor's wrapper does not free a dead buffer at once: it pools it and hands it to a later allocation of the same
size and dtype, while the peak over the range between them plus the buffer stays within the graph's peak by its own
estimate (``AllocateLine.should_reuse_buffer``).  Stock Inductor's estimate (``EfficientPeakEstimate``, from
``memory.compute_memory_timeline``) counts storages that are never allocated: a result a kernel writes in place over
its input, beside that input, and backward inputs that are saved views of parameters (a transposed weight), as if
freed after their last use.  So it is higher than what is ever live, and the pooled buffers fill the difference: on
a block stack run twice in one step (benchmarks/investigations/checkpoint_twice.py) the estimate ran above what was
live, and pooled buffers raised the measured peak.  In fxremat's compiles the estimate counts what the wrapper
allocates (``inductor_bounds_reuse_by_allocated_buffers``; the saved views are marked by
``mark_inputs_never_freed``), with the reuse on, as the user's config or the compile's options set it: reuse saves
an allocation per reused buffer (docs/DESIGN.md §6, with the figures).  The simulator replays
whichever bound the compile uses (``buffer_pool._pool_held``, ``walk.Walk``).
Tests: tests/passes/test_buffer_reuse.py, tests/passes/test_torch_versions.py."""

from __future__ import annotations

import contextlib
import contextvars
import operator
import threading

import torch._inductor.config as inductor_config

CONFIG_NAME = "allow_buffer_reuse"
# What the wrapper of the graph being simulated does with a dead buffer: frees it (None), or pools it within
# an estimate of the buffers really allocated (fxremat's compiles) or within stock Inductor's estimate.
ALLOCATED, ESTIMATED = "allocated", "estimated"
# (the compile's mode, stock Inductor's mode): set around fxremat's compiles, read by the partition once
# (``fxremat/compile_inputs.py`` ``simulator_inputs``); unset, fxremat's compile under the global config
_REUSE = contextvars.ContextVar("fxremat_buffer_reuse", default=None)
# The estimate fxremat's compiles bound the reuse by (``ESTIMATED``: stock Inductor's; benchmarks compare the two)
FXREMAT_ESTIMATE = ALLOCATED
_LOCK = threading.Lock()
_stock_estimate_init = None
# whether the backend of a device type runs generated kernels in groups that free their reads when flushed (the
# simulator's ``SchedulingRules.groups_generated_kernels``, handed in by ``inductor_bounds_reuse_by_allocated_buffers``)
_groups_kernels = None


def _reuses(options: dict) -> bool:
    return bool(options.get(CONFIG_NAME, getattr(inductor_config, CONFIG_NAME)))


@contextlib.contextmanager
def fxremat_buffer_reuse(options: dict):
    """Around fxremat's ``compile_fx`` call: tells the simulator what the compile does with dead buffers (the
    compile's Inductor ``options``, else the config) and what stock Inductor (the config, for the report's
    baseline) would do."""
    token = _REUSE.set((FXREMAT_ESTIMATE if _reuses(options) else None, ESTIMATED if _reuses({}) else None))
    try:
        yield
    finally:
        _REUSE.reset(token)


def default_buffer_reuse() -> str | None:
    """fxremat's compile's buffer reuse under Inductor's default config (``allow_buffer_reuse``'s default)."""
    entry = getattr(inductor_config, "_config", {}).get(CONFIG_NAME)
    return FXREMAT_ESTIMATE if (entry.default if entry is not None else True) else None


def inductor_buffer_reuse() -> str | None:
    """The buffer reuse of the graph being simulated (``walk.Walk.run``): the compile's, else fxremat's under the
    global config."""
    now = _REUSE.get()
    return (FXREMAT_ESTIMATE if _reuses({}) else None) if now is None else now[0]


def stock_buffer_reuse() -> str | None:
    """Stock Inductor's buffer reuse (PyTorch's split, the report's baseline), under the config as it was when
    fxremat's compile began."""
    now = _REUSE.get()
    return (ESTIMATED if _reuses({}) else None) if now is None else now[1]


# backward graph module meta: the names of its inputs whose storage outlives it (``mark_inputs_never_freed``)
NEVER_FREED_KEY = "fxremat_inputs_never_freed"


def mark_inputs_never_freed(gm, names: frozenset[str]) -> None:
    """Tell the estimate of fxremat's compiles which of ``gm``'s inputs keep their storage (views of a forward
    input, saved for backward: Inductor counts them as freed after their last use)."""
    gm.meta[NEVER_FREED_KEY] = frozenset(names)


def inductor_bounds_reuse_by_allocated_buffers(applies, groups_kernels) -> None:
    """In the compiles for which ``applies()`` is true, the wrapper's peak estimate (``EfficientPeakEstimate``)
    counts only the storages it allocates, until it frees them (``_estimate_allocated``): not the buffers Inductor
    removed, not an in-place result beside its input, not the backward inputs fxremat marked never freed.
    Everything it reads is complete once every kernel is generated, before the memory planning that builds the
    estimate.  ``groups_kernels(device_type)``: whether that device's backend frees a group's reads when the group
    is flushed (the simulator's backend rules).  Installed once."""
    from torch._inductor.codegen import wrapper

    global _stock_estimate_init, _groups_kernels
    with _LOCK:
        if _stock_estimate_init is not None:
            return
        _groups_kernels = groups_kernels
        stock = wrapper.EfficientPeakEstimate.__init__

        def estimate(self):
            if FXREMAT_ESTIMATE != ALLOCATED or not applies():
                return stock(self)
            _estimate_allocated(self)

        _stock_estimate_init = stock
        wrapper.EfficientPeakEstimate.__init__ = estimate


def _estimate_allocated(estimate) -> None:
    """``EfficientPeakEstimate``'s fields from the storages the wrapper allocates, until it frees them: the memory
    timeline of ``memory.compute_memory_timeline`` less the removed buffers, an in-place result (the wrapper's
    ``reuses``, made by ``codegen_inplace_reuse`` before the memory planning) counted as its input's storage living
    on, and a CPU kernel group's reads freed when the group is (``_flushed_after``)."""
    from torch._inductor.codegen.segmented_tree import SegmentedTree
    from torch._inductor.memory import compute_memory_timeline, get_freeable_input_buf
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    nodes = V.graph.scheduler.nodes
    freeable = get_freeable_input_buf(nodes, OrderedSet(V.graph.graph_inputs.keys()))
    infos = compute_memory_timeline(nodes, freeable, OrderedSet(V.graph.get_output_names()))[0]
    # kernel-local buffers, and inputs whose storage lives on (Inductor would count them as freed at last use)
    removed = V.graph.removed_buffers | getattr(V.graph.module, "meta", {}).get(NEVER_FREED_KEY, frozenset())
    kept = [(info.buffer.get_name(), info) for info in infos if info.buffer.get_name() not in removed]
    reuses = getattr(V.graph.wrapper_code, "reuses", {})
    names = {name for name, _ in kept}
    change = [0] * (len(nodes) + 1)
    for name, info in kept:
        if reuses.get(name) not in names:  # an in-place result allocates nothing
            change[info.start_step] += info.size_alloc
    freed_after = _flushed_after(nodes, _groups_kernels)
    for root, end in _storage_ends(kept, reuses):
        if end != -1:  # a graph output is never freed here
            change[freed_after[end] + 1] -= root.size_free
    by_node, now = [], 0
    for delta in change:
        now += delta
        by_node.append(now)
    estimate.overall_peak_memory = max([0, *by_node])
    estimate.segmented_tree = SegmentedTree(by_node, operator.add, max, 0)


def _flushed_after(nodes: list, groups_kernels) -> list[int]:
    """For each step, the step after which a buffer last read there is really freed.  On a backend that groups its
    generated kernels (the C++ backend) the scheduler adds each generated kernel to the backend's kernel group and
    frees what the group read only when it is flushed: before an extern kernel or a template, or at the graph's end
    (``Scheduler.codegen``); passes/simulator/walk.py's ``Walk.grouped`` models the same.  A kernel of another backend
    frees after itself."""
    after = [0] * len(nodes)
    flush = len(nodes) - 1
    for step in range(len(nodes) - 1, -1, -1):
        node = nodes[step]
        device = node.get_device()
        if node.is_extern() or node.is_template():
            after[step], flush = step, step - 1
        elif device is not None and not groups_kernels(device.type):
            after[step] = step
        else:
            after[step] = max(step, flush)
    return after


def _storage_ends(kept: list, reuses: dict) -> list:
    """[(the buffer info of each storage allocated, the last step any buffer written in place over it is used, or
    -1 where one is a graph output)]."""
    info_of = dict(kept)
    ends: dict = {}
    for name, info in kept:
        root = name
        for _ in range(len(reuses)):  # follow in-place writes back to the storage allocated
            if root not in reuses or reuses[root] not in info_of:
                break
            root = reuses[root]
        holder = info_of[root]
        before = ends.get(id(holder), (holder, info.end_step))[1]
        ends[id(holder)] = (holder, -1 if -1 in (before, info.end_step) else max(before, info.end_step))
    return list(ends.values())
