"""Inductor's buffer reuse (the wrapper's memory planning, ``allow_buffer_reuse``) in fxremat's compiles.

Inductor's wrapper does not free a dead buffer at once: it pools it and hands it to a later allocation of the same
size and dtype, while the peak over the range between them plus the buffer stays within the graph's peak by its own
estimate (``AllocateLine.should_reuse_buffer``).  That estimate (``EfficientPeakEstimate``, from
``memory.estimate_peak_memory``) counts the buffers that fusion keeps inside a kernel, so it is higher than what is
ever live, and the pooled buffers fill the difference: on a block stack run twice in one step
(benchmarks/checkpoint_twice.py) they held 9.6 MiB at the backward's peak, 17% of the step's peak
(``buffer_pool._pool_held`` replays the rule).  The reuse saves an allocation (0.3-2.6% of a CPU step,
benchmarks/RESULTS.md), not memory, so fxremat's compiles run without it unless the compile's Inductor options
set ``allow_buffer_reuse`` (``fxremat.backend(inductor_options={"allow_buffer_reuse": True})``, or ``options=`` of
``torch.compile``).  A global assignment of Inductor's config cannot be told from its default (every
``config.patch`` of the name, Inductor's own included, leaves it marked as set), so only the options count.
Tests: tests/passes/test_buffer_reuse.py, tests/passes/test_torch_versions.py."""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch._inductor.config as inductor_config

CONFIG_NAME = "allow_buffer_reuse"
# fxremat's own setting where the compile's options name none
FXREMAT_REUSES_BUFFERS = False
# (whether the compile running now reuses buffers, whether stock Inductor would): set around fxremat's compiles and
# by ``simulating_buffer_reuse``; unset, the simulator models fxremat's default compile
_REUSE = contextvars.ContextVar("fxremat_buffer_reuse", default=None)


@contextlib.contextmanager
def fxremat_buffer_reuse(options: dict):
    """Around fxremat's ``compile_fx`` call: yields the Inductor config patch for buffer reuse (fxremat's setting,
    or none where ``options``, the compile's Inductor options, name it), and tells the simulator what the compile
    does and what stock Inductor (the global config, for the report's baseline) would do."""
    reuse = bool(options.get(CONFIG_NAME, FXREMAT_REUSES_BUFFERS))
    token = _REUSE.set((reuse, bool(getattr(inductor_config, CONFIG_NAME))))
    try:
        yield {} if CONFIG_NAME in options else {CONFIG_NAME: reuse}
    finally:
        _REUSE.reset(token)


@contextlib.contextmanager
def simulating_buffer_reuse(reuse: bool):
    """The simulator models Inductor's wrapper with (``True``) or without buffer reuse inside this context."""
    token = _REUSE.set((reuse, reuse))
    try:
        yield
    finally:
        _REUSE.reset(token)


def inductor_reuses_buffers() -> bool:
    """Whether the wrapper of the graph being simulated reuses buffers (``walk.Walk.run``): the compile's, else
    fxremat's default."""
    now = _REUSE.get()
    return FXREMAT_REUSES_BUFFERS if now is None else now[0]


def stock_reuses_buffers() -> bool:
    """Whether Inductor without fxremat reuses buffers (PyTorch's split, the report's baseline): the global config
    as it was when fxremat's compile began."""
    now = _REUSE.get()
    return bool(getattr(inductor_config, CONFIG_NAME)) if now is None else now[1]


def buffer_reuse_as_now(stock: bool = False):
    """A context factory that puts back, later, the buffer reuse of the compile running now (``stock``: the one
    stock Inductor would use): for what fxremat computes after the compile (a report's deferred simulation)."""
    return functools.partial(simulating_buffer_reuse, stock_reuses_buffers() if stock else inductor_reuses_buffers())
