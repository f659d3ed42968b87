"""PyTorch's settings as fxremat reads them: the activation-memory knobs and region annotations
(``fxremat/knobs.py``, ``passes/graph/region_budget.py``: ``torch._functorch.config`` and the annotation of
``torch.autograd.graph.region_activation_memory_budget``, which differ across the supported releases), and
Inductor's layout switches (``FxrematBackend._layout_patches`` in ``fxremat/backend.py``)."""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._functorch import config as functorch_config

from .versions import MEMORY_BUDGET_ANNOTATION_KEY, TORCH


def functorch_knob(name: str):
    """The current value of ``torch._functorch.config.<name>`` (read at compile time: callers put what changes a
    partition into the compile-cache key)."""
    return getattr(functorch_config, name)


def functorch_knob_default(name: str):
    """``torch._functorch.config.<name>``'s default (its environment override included), to tell a value the
    user set from the default."""
    return functorch_config._config[name].default


def memory_budget_annotation(node: torch.fx.Node) -> float | None:
    """The budget of ``torch.autograd.graph.region_activation_memory_budget`` around the op that made ``node``, if
    any: ``node.meta["custom"]``, as PyTorch's partitioner reads it (``fx.traceback._get_memory_budget_annotation``,
    2.13 on; the same read here, for the releases before it)."""
    custom = node.meta.get("custom")
    return custom.get(MEMORY_BUDGET_ANNOTATION_KEY) if isinstance(custom, dict) else None


def region_memory_budget(budget: float):
    """``torch.autograd.graph.region_activation_memory_budget(budget)`` (torch 2.13 on), or before 2.13 the
    annotation it makes (``torch.fx.traceback.annotate``, which Dynamo traces in 2.11 and 2.12), read alike."""
    if TORCH >= (2, 13):
        return torch.autograd.graph.region_activation_memory_budget(budget)
    return torch.fx.traceback.annotate({MEMORY_BUDGET_ANNOTATION_KEY: float(budget)})


# Inductor's switches of its layout optimisation (``GraphLowering.decide_layout_opt`` reads both)
LAYOUT_SWITCHES = ("layout_optimization", "force_layout_optimization")


def inductor_layout_switches_at_default() -> bool:
    """Whether ``torch._inductor.config``'s layout switches hold their defaults (environment overrides included:
    ``TORCHINDUCTOR_LAYOUT_OPTIMIZATION``, ``TORCHINDUCTOR_FORCE_LAYOUT_OPT``), i.e. the user has not chosen."""
    from torch._inductor import config as inductor_config

    return all(getattr(inductor_config, name) == inductor_config._config[name].default for name in LAYOUT_SWITCHES)


def inductor_config_value(name: str):
    """``torch._inductor.config.<name>`` under the config in force (a compile's patches included): read once per
    partition into the simulator's inputs (``fxremat/compile_inputs.py``: ``simulator_inputs``)."""
    from torch._inductor import config as inductor_config

    return getattr(inductor_config, name)


# ``torch.backends.mkldnn.enabled`` in a fresh process (``torch._C``'s default)
MKLDNN_ENABLED_BY_DEFAULT = True


def mkldnn_enabled() -> bool:
    """``torch.backends.mkldnn.enabled`` now (Inductor's layout decision reads it)."""
    return bool(torch.backends.mkldnn.enabled)


@contextlib.contextmanager
def mkldnn_enabled_as(enabled: bool):
    """``torch.backends.mkldnn.enabled`` set to ``enabled`` inside, restored after (nothing set where it is so)."""
    before = torch._C._get_mkldnn_enabled()
    if before == enabled:
        yield
        return
    torch._C._set_mkldnn_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def inductor_config_patched(changes: dict):
    """``torch._inductor.config`` with ``changes`` in force (a context manager): what the partitioner simulates a
    compile under (``layout_choice.decide_layout``)."""
    from torch._inductor import config as inductor_config

    return inductor_config.patch(changes)


def inner_compile_with_layout(choice):
    """Inductor's ``compile_fx_inner`` under the layout ``choice`` (``layout_choice.LayoutChoice``) made by the
    partitioner of this very compile: ``compile_fx`` calls it for the forward and, lazily, for the backward (after
    applying the compile's own config patches, which this one overrides)."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner_compile(gm, example_inputs, **kwargs):
        with inductor_config_patched(choice.inductor_patch()):
            return compile_fx_inner(gm, example_inputs, **kwargs)

    return inner_compile


def inductor_default(name: str):
    """The default of ``torch._inductor.config.<name>`` in the running torch (not what a patch sets now)."""
    from torch._inductor import config as inductor_config

    entry = getattr(inductor_config, "_config", {}).get(name)
    return entry.default if entry is not None else getattr(inductor_config, name, None)


def inductor_reorders_for_peak_memory() -> bool:
    """Whether Inductor, under the config in force (a compile's patches included), reorders each graph's kernels
    for its estimated peak (``config.reorder_for_peak_memory``; ``Scheduler._init`` ->
    ``memory.reorder_for_peak_memory``): the simulator replays it (``passes/simulator/peak_order.py``)."""
    from torch._inductor import config as inductor_config

    return bool(getattr(inductor_config, "reorder_for_peak_memory", False))


@functools.cache
def inductor_estimate_counts_outputs() -> bool:
    """Whether Inductor's peak estimate (``memory.estimate_peak_memory``, which picks the reordering) holds a graph
    output from its kernel on.  Before torch 2.13 it subtracts an output's bytes at step 0 (``end_step + 1`` with
    ``end_step == -1``), so outputs count for nothing after their kernel and less than nothing before it.  Asked
    of Inductor itself, on a one-kernel graph that returns its one buffer; the release is the answer if that fails."""
    try:
        from torch._inductor import memory
        from torch.utils._ordered_set import OrderedSet

        class _Buffer:
            mpi_buffer = memory.MemoryPlanningInfoForBuffer(size_alloc=1, size_free=1)

            def get_name(self) -> str:
                return "out"

        class _Kernel:
            def get_outputs(self) -> list:
                return [_Buffer()]

        return memory.estimate_peak_memory([_Kernel()], {}, OrderedSet(["out"]))[0] == 1
    except Exception:  # noqa: BLE001 -- a probe: the release decides instead
        return TORCH >= (2, 13)


def inductor_layout_optimisation(
    gm: torch.fx.GraphModule, layout_optimization: bool, force_layout_optimization: bool, mkldnn_enabled: bool
) -> bool:
    """Whether Inductor compiles this graph with layout optimisation (convolutions and their inputs in channels-last)
    where its config's two layout switches and ``torch.backends.mkldnn.enabled`` hold the given values: Inductor's
    own per-graph decision (``GraphLowering.decide_layout_opt``), read off the same FX graph (its nodes'
    ``meta["val"]``) under a scoped patch of those three values, restored after, so the simulator cannot drift from
    it and its answer depends on its inputs alone (docs/DESIGN.md §6.0)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering

    wanted = {"layout_optimization": layout_optimization, "force_layout_optimization": force_layout_optimization}
    changes = {name: value for name, value in wanted.items() if getattr(inductor_config, name) != value}
    with inductor_config_patched(changes), mkldnn_enabled_as(mkldnn_enabled):
        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
