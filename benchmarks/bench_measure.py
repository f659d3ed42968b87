"""One model x one configuration, measured in this process: what ``benchmarks/run.py --worker`` runs.

Every measured figure is taken from the outside, never read from fxremat's report: saved bytes through
``saved_tensors_hooks`` (``fxremat.measure.measure_saved``), peak memory of one training step (CUDA allocator
statistics, or the CPU profiler's memory events), step times, compile time, and gradients against eager.  Two
figures do come from fxremat's report: its own partition time, which only it knows, and its simulated step peak,
kept beside the measured one so that one run says how far the simulation is off (``simulated_facts``).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from bench_models import Workload, build_workload

# Configuration -> PyTorch's activation_memory_budget (patched for the compile) for the PyTorch rows.
PYTORCH_BUDGETS = {
    "pytorch_default": None,
    "pytorch_budget_0.5": 0.5,
    "pytorch_budget_0.2": 0.2,
    "pytorch_budget_0.1": 0.1,
    "pytorch_budget_0.0": 0.0,
}
# fxremat rows with the knob PyTorch users know: memory_budget as a fraction (0.0 = the fewest-bytes plan), to set
# beside the PyTorch row of the same value (issue #15).
FXREMAT_BUDGETS = {"fxremat_budget_0.5": 0.5, "fxremat_budget_0.2": 0.2, "fxremat_budget_0.0": 0.0}
# fxremat rows with an absolute budget: the saved bytes measured by this PyTorch row of the same model.
BUDGET_SOURCES = {
    "fxremat_at_pytorch_0.5": "pytorch_budget_0.5",
    "fxremat_at_pytorch_0.2": "pytorch_budget_0.2",
    "fxremat_at_pytorch_0.1": "pytorch_budget_0.1",
}
# fxremat rows with a peak budget (a fraction: 0.0 = the lowest-peak plan it finds, 1.0 = its default's peak).
PEAK_BUDGETS = {"fxremat_peak_0.5": 0.5, "fxremat_peak_0.0": 0.0}
# ... and the lowest-peak plan within the saved bytes this PyTorch row measured (same saved bytes, lower peak).
PEAK_AT_SOURCES = {
    "fxremat_peak_at_pytorch_0.5": "pytorch_budget_0.5",
    "fxremat_peak_at_pytorch_0.1": "pytorch_budget_0.1",
}
# fxremat's default without Inductor's buffer reuse, and with the reuse bounded by stock Inductor's estimate rather
# than by the bytes really allocated (docs/DESIGN.md §6): what the reuse and its bound cost in peak and save in step
# time (issue #22).
BUFFER_REUSE = {"fxremat_no_buffer_reuse": False, "fxremat_stock_reuse_bound": True}
# The model run uncompiled (beside --checkpointed's rows: what the user's checkpointing gives in eager).
EAGER = "eager"
# Run order (benchmarks/run.py's plan): every PyTorch row before the fxremat rows that take its measured bytes.
CONFIGS = (
    EAGER,
    *PYTORCH_BUDGETS,
    "fxremat_default",
    *FXREMAT_BUDGETS,
    *BUDGET_SOURCES,
    *PEAK_BUDGETS,
    *PEAK_AT_SOURCES,
    *BUFFER_REUSE,
)
# The default run: PyTorch's default and budgets 0.5 / 0.1 against fxremat's default, the same knob at 0.5, and
# fxremat at PyTorch's measured bytes.  The rest were added for the peak studies (issues #8, #15): --configs.
DEFAULT_CONFIGS = (
    "pytorch_default",
    "pytorch_budget_0.5",
    "pytorch_budget_0.1",
    "fxremat_default",
    "fxremat_budget_0.5",
    "fxremat_at_pytorch_0.5",
    "fxremat_at_pytorch_0.1",
)
QUICK_CONFIGS = ("pytorch_default", "fxremat_default")
# Issue #15's table: every setting it judges (memory_budget 1.0 = the default plan), both partitioners.
ISSUE15_CONFIGS = (
    "pytorch_default",
    "pytorch_budget_0.5",
    "pytorch_budget_0.2",
    "pytorch_budget_0.0",
    "fxremat_default",
    "fxremat_budget_0.5",
    "fxremat_budget_0.2",
    "fxremat_budget_0.0",
    "fxremat_at_pytorch_0.5",
    "fxremat_at_pytorch_0.2",
    "fxremat_peak_0.5",
    "fxremat_peak_0.0",
)
# --checkpointed's default run (issue #22): the user's checkpointing in eager, under Inductor, under fxremat.
CHECKPOINTED_CONFIGS = (EAGER, "pytorch_default", "fxremat_default")
# Names that --configs expands to a list.
CONFIG_SETS = {
    "default": DEFAULT_CONFIGS,
    "quick": QUICK_CONFIGS,
    "issue15": ISSUE15_CONFIGS,
    "checkpointed": CHECKPOINTED_CONFIGS,
}


def expand_configs(names: list[str]) -> list[str]:
    """Set names (``CONFIG_SETS``) replaced by their configurations, duplicates dropped, order kept."""
    out: list[str] = []
    for name in names:
        out += CONFIG_SETS.get(name, (name,))
    return list(dict.fromkeys(out))


WARMUP_STEPS = 3
GRAD_TOLERANCE = 1e-3  # max relative error per parameter (fxremat.measure.max_relative_error)


# ---- peak memory of one step: fxremat.measure, shared with benchmarks/investigations/peak_memory.py ---------------
from fxremat.measure import (  # noqa: E402,F401  (re-exported for the tests)
    cpu_memory_events,
    cpu_peak_bytes,
    cuda_peak_bytes,
    peak_from_memory_events,
    step_peak_bytes,
)

# ---- one training step -----------------------------------------------------------------------------------------


def train_step(compiled: Callable, work: Workload) -> None:
    work.loss(work.forward(compiled)).backward()


def timed_step(compiled: Callable, work: Workload, device: str) -> float:
    """Seconds for forward + backward; grads are zeroed before the clock starts (set to None, as optimisers do)."""
    work.model.zero_grad(set_to_none=True)
    _sync(device)
    start = time.perf_counter()
    train_step(compiled, work)
    _sync(device)
    return time.perf_counter() - start


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def excluded_tensors(work: Workload) -> list[torch.Tensor]:
    return [*work.model.parameters(), *work.model.buffers(), *work.input_tensors()]


# ---- gradients against eager -----------------------------------------------------------------------------------


def has_dropout(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def eager_grads(work: Workload) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(work.model)
    model.zero_grad(set_to_none=True)
    work.loss(work.forward(model)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# A parameter whose eager gradient is below this fraction of the model's largest gradient has a gradient that is
# zero in exact arithmetic (an attention key bias: softmax ignores a per-row shift), so eager and compiled both
# return rounding noise (~1e-11) and the relative error of one noise against another is meaningless (0.5-1.1 on
# BERT and ViT, for PyTorch's partitioner as for ours).  Such a parameter is compared on the model's scale.
NEAR_ZERO_GRAD = 1e-6


def grad_errors(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> tuple[float, list[str]]:
    """(worst error over parameters, names compared on the model's scale because their gradient is ~0).

    ``fxremat.measure.max_relative_error`` per parameter; a parameter that eager gives a gradient and the compiled
    model does not counts as infinitely wrong."""
    from fxremat.measure import max_relative_error

    grads = dict(model.named_parameters())
    model_scale = max((g.abs().max().item() for g in reference.values()), default=0.0)
    errors, near_zero = [], []
    for name, expected in reference.items():
        actual = grads[name].grad
        if actual is None:
            errors.append(float("inf"))
        elif expected.abs().max().item() < NEAR_ZERO_GRAD * model_scale:
            near_zero.append(name)
            errors.append((actual - expected).abs().max().item() / model_scale)
        else:
            errors.append(max_relative_error(actual, expected))
    return max(errors, default=0.0), near_zero


# ---- backends --------------------------------------------------------------------------------------------------


def _inductor_backend():
    """Inductor's own backend (what ``backend="inductor"`` calls), as a new object: Dynamo reuses a graph compiled
    for the same backend object, and functorch's budget is read only when compiling, so in one process
    (``step_interleaved.py``) a second PyTorch budget given the string "inductor" would run the first one's graph
    (measured: every PyTorch budget after the first "ran eagerly")."""

    def inductor(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    return inductor


def make_backend(config: str, budget_bytes: int | None):
    """(backend for torch.compile, context manager to hold around the first call: the partition happens there);
    ``eager``: no backend, the model runs uncompiled."""
    if config == EAGER:
        return None, contextlib.nullcontext
    if config in PYTORCH_BUDGETS:
        budget = PYTORCH_BUDGETS[config]
        if budget is None:
            return "inductor", contextlib.nullcontext
        return _inductor_backend(), lambda: torch._functorch.config.patch(activation_memory_budget=budget)
    import fxremat

    # compare_default=False: the production setting; otherwise every fxremat compile would also run PyTorch's
    # partitioner on a copy of the graph (for the report) and pay for it in compile time.
    if config == "fxremat_default":
        return fxremat.backend(compare_default=False), contextlib.nullcontext
    if config in FXREMAT_BUDGETS:
        return fxremat.backend(compare_default=False, memory_budget=FXREMAT_BUDGETS[config]), contextlib.nullcontext
    if config in PEAK_BUDGETS:
        return fxremat.backend(compare_default=False, peak_budget=PEAK_BUDGETS[config]), contextlib.nullcontext
    if config in BUFFER_REUSE:
        inductor = {"allow_buffer_reuse": BUFFER_REUSE[config]}
        backend = fxremat.backend(compare_default=False, inductor_options=inductor)
        return backend, stock_reuse_bound if config == "fxremat_stock_reuse_bound" else contextlib.nullcontext
    sources = {**BUDGET_SOURCES, **PEAK_AT_SOURCES}
    if config in sources:
        if budget_bytes is None:
            raise ValueError(f"{config} needs the saved bytes of {sources[config]} (--budget-bytes)")
        peak = dict(peak_budget=0.0) if config in PEAK_AT_SOURCES else {}
        backend = fxremat.backend(compare_default=False, memory_budget=int(budget_bytes), **peak)
        return backend, contextlib.nullcontext
    raise ValueError(f"unknown configuration {config!r}; one of {list(CONFIGS)}")


def fxremat_facts(backend) -> dict[str, Any]:
    """What only fxremat's reports can say: its partition time, and whether it fell back or missed a budget."""
    reports = getattr(backend, "reports", None)
    if reports is None:
        return dict(partition_s=None)
    return dict(
        partition_s=sum(r.partition_seconds for r in reports) if reports else None,
        fxremat_graphs=len(reports),
        fxremat_fallbacks=[r.fallback_reason for r in reports if r.fallback_reason],
        fxremat_budget_met=[r.budget_met for r in reports if r.budget_met is not None],
    )


def simulated_facts(backend, peak_bytes: int, graphs: int) -> dict[str, Any]:
    """fxremat's simulated step peak beside the measured one, as benchmarks/investigations/peak_memory.py compares them:
    the report's ``simulated_peak_bytes`` (its split's step, parameter gradients included) against the step's peak above
    what was live at its start, grads set to None before.  Reading the field runs the deferred simulation
    (fxremat/report.py), so call this outside the timed steps.

    Only a step of one Dynamo graph with one joint graph has a single simulated step: with more, each report
    simulates its own graph alone, and neither their sum nor their maximum is the step's peak, so the row keeps
    the per-graph figures (``simulated_peak_bytes_per_graph``) and says why there is no ``sim_error``."""
    reports = getattr(backend, "reports", None)
    if reports is None:
        return {}
    facts: dict[str, Any] = dict(
        simulated_peak_bytes=None,
        sim_error=None,
        simulated_peak_at=None,
        simulated_peak_bytes_per_graph=None,
        sim_note=None,
    )
    try:
        per_graph = facts["simulated_peak_bytes_per_graph"] = [r.simulated_peak_bytes for r in reports]
    except Exception as exc:  # noqa: BLE001 - a failing simulation must not cost the row its measurements
        facts["sim_note"] = f"simulation failed: {type(exc).__name__}: {exc}"[:300]
        return facts
    if len(reports) != 1 or graphs != 1:
        facts["sim_note"] = f"{graphs} Dynamo graph(s), {len(reports)} joint graph(s): no single simulated step"
    elif per_graph[0] is None:
        facts["sim_note"] = "no simulation in the report (a fallback, or a report re-emitted from the cache)"
    else:
        facts.update(simulated_peak_bytes=per_graph[0], simulated_peak_at=reports[0].simulated_peak_at)
        facts["sim_error"] = per_graph[0] / peak_bytes - 1 if peak_bytes else None
    return facts


def dynamo_graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ---- one configuration -----------------------------------------------------------------------------------------


def measure(
    model_name: str,
    size: str,
    config: str,
    repeats: int,
    device: str,
    budget_bytes: int | None = None,
    checkpointed: bool = False,
) -> dict[str, Any]:
    """Build, compile and time one model under one configuration; a row of plain JSON values.  ``checkpointed``:
    its blocks under ``torch.utils.checkpoint`` (``bench_models.checkpoint_blocks``, issue #22)."""
    work = build_workload(model_name, size, device, checkpointed)
    row: dict[str, Any] = dict(model=model_name, config=config, size=size, device=device, model_info=work.info)
    row["checkpointed"] = checkpointed
    row["memory_budget_bytes"] = budget_bytes
    row["threads"] = torch.get_num_threads()
    graphs_before = dynamo_graph_count()  # Dynamo's counters outlive torch._dynamo.reset() (in-process runs)
    reference = None if has_dropout(work.model) else eager_grads(work)

    backend, first_call_context = make_backend(config, budget_bytes)
    compiled = work.model if backend is None else torch.compile(work.model, backend=backend)
    row.update(first_step(compiled, work, device, first_call_context))
    error, near_zero = (None, []) if reference is None else grad_errors(work.model, reference)
    row["max_grad_error"] = error
    row["near_zero_grad_params"] = near_zero
    row["grads_matched"] = None if error is None else bool(error < GRAD_TOLERANCE)

    for _ in range(WARMUP_STEPS):
        timed_step(compiled, work, device)
    work.model.zero_grad(set_to_none=True)
    row["peak_bytes"], row["peak_method"] = step_peak_bytes(lambda: train_step(compiled, work), device)
    # the activation peak (issue #8) is the step's peak less the parameter gradients it allocates
    row["param_grad_bytes"] = sum(p.numel() * p.element_size() for p in work.model.parameters() if p.requires_grad)
    times = [timed_step(compiled, work, device) * 1e3 for _ in range(repeats)]
    row["step_ms"] = statistics.median(times)
    row["step_times_ms"] = times
    row["graphs"] = dynamo_graph_count() - graphs_before
    row.update(fxremat_facts(backend))
    row.update(simulated_facts(backend, row["peak_bytes"], row["graphs"]))
    row["error"] = None
    return row


def first_step(compiled: Callable, work: Workload, device: str, context) -> dict[str, Any]:
    """The compiling call: its wall time is the compile time; what autograd saves here is the saved bytes."""
    from fxremat.measure import measure_saved

    work.model.zero_grad(set_to_none=True)
    _sync(device)
    start = time.perf_counter()
    with context():
        out, saved = measure_saved(lambda: work.forward(compiled), excluded_tensors(work))
        work.loss(out).backward()
    _sync(device)
    return dict(compile_s=time.perf_counter() - start, saved_bytes=saved.nbytes, saved_tensors=saved.count)


def measure_or_error(
    model_name: str, size: str, config: str, repeats: int, device: str, budget_bytes=None, checkpointed=False
) -> dict:
    """``measure``, but a failure is a row with an ``error`` (the exception and the innermost frames)."""
    try:
        return measure(model_name, size, config, repeats, device, budget_bytes, checkpointed)
    except Exception as exc:  # noqa: BLE001 - one model failing must never abort the benchmark
        return error_row(model_name, size, config, device, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def error_row(model_name: str, size: str, config: str, device: str, error: str, detail: str = "") -> dict:
    return dict(model=model_name, config=config, size=size, device=device, error=error[:2000], detail=detail[-4000:])


@contextlib.contextmanager
def stock_reuse_bound():
    """fxremat's compiles bound Inductor's buffer reuse by stock Inductor's peak estimate (kernel-local buffers
    counted) inside this context, with an empty Inductor cache (the bound is not in the cache key)."""
    from fxremat_passes import _torch_private as tp
    from fxremat_passes._torch_private import buffer_reuse

    with tp.fresh_inductor_cache():
        bound, buffer_reuse.FXREMAT_ESTIMATE = buffer_reuse.FXREMAT_ESTIMATE, tp.ESTIMATED
        try:
            yield
        finally:
            buffer_reuse.FXREMAT_ESTIMATE = bound
