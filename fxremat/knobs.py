"""PyTorch's own memory knobs (``torch._functorch.config``, region annotations): honoured, mapped, or ignored with
one warning each, never dropped without a word (docs/OPTIONS.md, "PyTorch's knobs and tags").

``effective_options`` runs at the start of every partition (compile time): it resolves the memory budget from, in
order of precedence, the graph's own annotation (``passes/graph/region_budget.py``), fxremat's ``memory_budget``, and
``torch._functorch.config.activation_memory_budget`` below 1.0, and says which one it used.  Region annotations
that are not one budget over the whole forward are per-region budgets, handed on beside the options.  What it
reads from torch's config is in ``Options.cache_key()`` too, so a changed knob never reuses a stale cached
partition.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.region_budget import (
    LEGACY_SOURCE,
    REGION_SOURCE,
    RegionAnnotations,
    RegionBudgetError,
    legacy_budget,
    read_regions,
)

from .options import Options, normalise_budget

FXREMAT_SOURCE = "fxremat"
TORCH_CONFIG_SOURCE = "torch._functorch.config"
TORCH_BUDGET = "activation_memory_budget"

# torch._functorch.config knobs that PyTorch's partitioner reads and fxremat does not: why, and what to use.
IGNORED_KNOBS = {
    "activation_memory_budget_solver": "fxremat's budget is a min-cut price search refined by an exact MILP; "
    "choose with fxremat.backend(solver=...)",
    "activation_memory_budget_runtime_estimator": "fxremat prices recomputation with its roofline cost model; "
    "choose the profile with fxremat.backend(device=...)",
    "ban_recompute_used_far_apart": "fxremat has no ban heuristics: it prices recompute time; to recompute more, "
    "raise memory_price or set memory_budget",
    "ban_recompute_long_fusible_chains": "fxremat has no ban heuristics (see ban_recompute_used_far_apart)",
    "ban_recompute_materialized_backward": "fxremat has no ban heuristics (see ban_recompute_used_far_apart)",
    "ban_recompute_not_in_allowlist": "fxremat has no allow-list: every op is priced by its FLOPs and traffic",
    "ban_recompute_reductions": "fxremat has no ban heuristics (see ban_recompute_used_far_apart)",
    "aggressive_recomputation": "it turns PyTorch's ban heuristics off; fxremat has none (use memory_price)",
    "max_dist_from_bw": "it tunes ban_recompute_used_far_apart, a heuristic fxremat does not have",
    "recompute_views": "a saved view costs its base's storage and recomputing a view is free: the cut decides views "
    "like any value",
    "treat_parameters_as_free_to_save": "fxremat always counts graph inputs (parameters included) as free",
    "unsafe_allow_optimization_of_collectives": "fxremat never recomputes a collective",
    "enable_activation_offloading": "fxremat offloads only the storages it chooses itself (offload=True or 'plan' "
    "with a peak_budget, docs/DESIGN.md §16); a value tagged MUST_CPU_OFFLOAD is saved, PREFER_CPU_OFFLOAD is "
    "weighed as PREFER_SAVE",
    "_sync_decision_cross_ranks": "fxremat does not exchange plans across ranks (the same graph gives the same cut)",
    "visualize_memory_budget_pareto": "fxremat reports its memory/recompute frontier in report.frontier",
    "memory_budget_pareto_dir": "fxremat reports its memory/recompute frontier in report.frontier",
}


class FxrematKnobWarning(UserWarning):
    """A PyTorch memory setting fxremat does not apply as set (once per process per setting and value)."""


_warned: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, FxrematKnobWarning, stacklevel=4)


def warn_ignored_knobs() -> None:
    """One warning per knob (and value) set away from its default that fxremat does not follow."""
    for name, why in IGNORED_KNOBS.items():
        value, default = tp.functorch_knob(name), tp.functorch_knob_default(name)
        if value != default:
            _warn_once(
                ("ignored", name, repr(value)),
                f"fxremat ignores torch._functorch.config.{name}={value!r} (default {default!r}): {why}.",
            )


def torch_memory_budget() -> float | None:
    """``torch._functorch.config.activation_memory_budget`` when set below 1.0 (PyTorch's default plan), else None."""
    value = tp.functorch_knob(TORCH_BUDGET)
    if value is None or value == 1.0:
        return None
    return normalise_budget(float(value), f"torch._functorch.config.{TORCH_BUDGET}")


def effective_options(
    options: Options, joint: fx.GraphModule, num_fwd_outputs: int
) -> tuple[Options, str | None, RegionAnnotations | None]:
    """(the options with the memory budget this graph gets, where that budget came from (None: no budget), the
    graph's per-region budgets or None).  One region over the whole forward is the graph's budget; several regions,
    or one over part of the forward, are per-region budgets (``passes/choice/regions.py``), and the rest of the graph
    keeps the budget it has without them.  Raises ``RegionBudgetError`` for annotations fxremat cannot apply."""
    warn_ignored_knobs()
    _warn_offload_tags(joint)
    regions = read_regions(joint, num_fwd_outputs)
    whole = regions.whole_graph_budget
    if whole is not None:
        return _annotated(options, whole, REGION_SOURCE), REGION_SOURCE, None
    options, source = _graph_budget(options, joint)
    if not regions.several:
        return options, source, None
    if options.peak_budget is not None:
        raise RegionBudgetError(
            f"{REGION_SOURCE}: this graph has per-region budgets {list(regions.budgets)}"
            f"{' and forward ops outside them' if regions.uncovered else ''}, and fxremat's peak_budget="
            f"{options.peak_budget!r} is set; fxremat does not combine the two yet. Drop peak_budget, or use one "
            "region around the whole forward (a graph break, torch._dynamo.graph_break(), at the regions' edges "
            "makes each region a graph of its own)."
        )
    return options, source, regions


def _annotated(options: Options, budget: float, source: str) -> Options:
    """``options`` with the graph's annotated budget, warning once when it overrides fxremat's own."""
    if options.memory_budget is not None and options.memory_budget != budget:
        _warn_once(
            ("region", options.memory_budget, budget),
            f"fxremat: {source} {budget!r} overrides fxremat's memory_budget={options.memory_budget!r} "
            "for the graph it covers (the annotation is the more specific setting).",
        )
    return dataclasses.replace(options, memory_budget=budget)


def _graph_budget(options: Options, joint: fx.GraphModule) -> tuple[Options, str | None]:
    """The graph's own budget without region annotations: the legacy marker, fxremat's option, PyTorch's knob."""
    legacy = legacy_budget(joint)
    torch_budget = torch_memory_budget()
    if legacy is not None:
        return _annotated(options, legacy, LEGACY_SOURCE), LEGACY_SOURCE
    if options.memory_budget is not None:
        if torch_budget is not None and torch_budget != options.memory_budget:
            _warn_once(
                ("both", options.memory_budget, torch_budget),
                f"fxremat: memory_budget={options.memory_budget!r} (fxremat's) and "
                f"torch._functorch.config.{TORCH_BUDGET}={torch_budget!r} are both set; using fxremat's.",
            )
        return options, FXREMAT_SOURCE
    if torch_budget is not None:
        return dataclasses.replace(options, memory_budget=torch_budget), TORCH_CONFIG_SOURCE
    return options, None


def _warn_offload_tags(joint: fx.GraphModule) -> None:
    """Once per process: the graph's CPU-offload tags are kept, not offloaded (docs/DESIGN.md §16)."""
    tags = {"MUST_CPU_OFFLOAD", "PREFER_CPU_OFFLOAD"}
    found = sorted({getattr(n.meta.get("recompute"), "name", None) for n in joint.graph.nodes} & tags)
    if found:
        _warn_once(
            ("offload_tags", *found),
            f"fxremat: values tagged {' and '.join(found)} are kept on the device, not offloaded: fxremat offloads "
            "only the storages it chooses under a peak_budget (offload=True); MUST_CPU_OFFLOAD is saved, "
            "PREFER_CPU_OFFLOAD weighed as PREFER_SAVE (docs/DESIGN.md §16)",
        )
