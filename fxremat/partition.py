"""The partition function: the passes in order, the PyTorch baseline for the report, and the fallback.

    prepare -> classify -> annotate_costs -> build_flow_problem -> solve_min_cut -> split -> describe

Any exception inside our passes: one warning naming the graph and the cause, then PyTorch's default partitioner
(with its own defaults) for that graph, and ``fallback_reason`` in the report; ``strict=True`` raises instead.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.budget import Plan
from fxremat_passes.costs import DeviceProfile, annotate_costs
from fxremat_passes.cse import prepare_joint_graph
from fxremat_passes.describe import describe_split
from fxremat_passes.flow_problem import build_flow_problem
from fxremat_passes.liveness import PeakEstimate, simulate_step
from fxremat_passes.plan_memory import build_joint_memory, estimate_peak
from fxremat_passes.roles import Policy, Role, classify, recompute_tag
from fxremat_passes.split import split_or_fallback

from .options import Options
from .plan import FxrematBudgetWarning, choose_plan, fastest_first, peak_candidates, peak_shortlist, plan_key
from .report import CutReport, describe_fields, never_recomputed_counts

log = logging.getLogger(__name__)

PASSES = ("prepare", "classify", "annotate_costs", "build_flow_problem", "solve_min_cut", "split", "describe")

# Test-only: called with each pass name before it runs; raising from it simulates a bug in that pass.
_fault_hook: Callable[[str], None] | None = None


@contextlib.contextmanager
def inject_fault(pass_name: str, error: Exception | None = None) -> Iterator[None]:
    """Make ``pass_name`` raise (tests of the fallback path)."""
    if pass_name not in PASSES:
        raise ValueError(f"unknown pass {pass_name!r}; one of {PASSES}")
    global _fault_hook

    def hook(name: str) -> None:
        if name == pass_name:
            raise error or RuntimeError(f"injected fault in {pass_name}")

    previous, _fault_hook = _fault_hook, hook
    try:
        yield
    finally:
        _fault_hook = previous


def _enter(pass_name: str) -> None:
    if _fault_hook is not None:
        _fault_hook(pass_name)


class FxrematFallbackWarning(UserWarning):
    """fxremat could not partition a graph and used PyTorch's default partitioner for it."""


@dataclass(frozen=True)
class PartitionRequest:
    joint: fx.GraphModule
    joint_inputs: object
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] | None
    graph_id: str


def graph_device(joint: fx.GraphModule) -> tuple[str | None, str | None]:
    for node in joint.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type != "meta":
            if val.device.type == "cuda" and torch.cuda.is_available():
                return "cuda", torch.cuda.get_device_name(val.device)
            return val.device.type, None
    return None, None


def _why_recomputed(node: fx.Node, role: Role) -> str:
    if recompute_tag(node) == Policy.MUST_RECOMPUTE:
        return "tagged MUST_RECOMPUTE"
    if recompute_tag(node) == Policy.PREFER_RECOMPUTE:
        return "tagged PREFER_RECOMPUTE, and cheaper"
    return "cheaper to recompute than to keep"


# At most this many points of the simulated memory timeline go into a report (enough for a chart).
TIMELINE_POINTS = 400


def _simulate(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> PeakEstimate | None:
    """The liveness simulation of a split; informative, so a failure is logged, never raised."""
    try:
        return simulate_step(fw, bw, num_fwd_outputs)
    except Exception as error:
        log.debug("memory simulation failed: %s", error, exc_info=True)
        return None


def _timeline(peak: PeakEstimate) -> tuple[tuple[str, str, int], ...]:
    """At most about TIMELINE_POINTS evenly spaced points of the timeline, always with the peak and the first
    backward point (a chart marks both)."""
    timeline = peak.timeline
    step = max(1, len(timeline) // TIMELINE_POINTS)
    keep = set(range(0, len(timeline), step))
    keep |= {
        i for i, (phase, node, nbytes) in enumerate(timeline) if (phase, node) == (peak.peak_phase, peak.peak_node)
    }
    keep |= {next((i for i, point in enumerate(timeline) if point[0] == "backward"), 0)}
    return tuple(timeline[i] for i in sorted(keep) if i < len(timeline))


def _peak_fields(peak: PeakEstimate | None) -> dict:
    if peak is None:
        return {}
    return dict(
        simulated_peak_bytes=peak.peak_bytes,
        simulated_activation_peak_bytes=peak.activation_peak_bytes,
        simulated_peak_at=f"{peak.peak_phase}:{peak.peak_node}",
        memory_timeline=_timeline(peak),
    )


# Candidate plans for a peak budget whose real split is simulated (each costs a split and a simulation).
PEAK_SIMULATED_CANDIDATES = 10

# PyTorch's activation_memory_budget values shown beside fxremat's frontier (compare_budgets).
PYTORCH_BUDGETS = (0.5, 0.1, 0.0)


def _baseline(request: PartitionRequest, profile: DeviceProfile, compare_budgets: bool = False) -> dict:
    start = time.perf_counter()
    try:
        joint = tp.copy_graph_module(request.joint)
        fw, bw = tp.pytorch_default_partition(
            joint,
            request.joint_inputs,
            num_fwd_outputs=request.num_fwd_outputs,
            static_lifetime_input_indices=request.static_lifetime_input_indices,
        )
        described = describe_split(fw, bw, request.num_fwd_outputs, profile)
    except Exception as error:  # the baseline is informative only; never let it break a compile
        log.warning("PyTorch's default partitioner failed on %s: %s", request.graph_id, error)
        return dict(baseline_error=f"{type(error).__name__}: {error}")
    default_seconds = time.perf_counter() - start
    peak = _simulate(fw, bw, request.num_fwd_outputs)
    budget_points = []
    for budget in PYTORCH_BUDGETS if compare_budgets else ():
        try:
            bfw, bbw = tp.pytorch_default_partition(
                tp.copy_graph_module(request.joint),
                request.joint_inputs,
                num_fwd_outputs=request.num_fwd_outputs,
                static_lifetime_input_indices=request.static_lifetime_input_indices,
                activation_memory_budget=budget,
            )
            d = describe_split(bfw, bbw, request.num_fwd_outputs, profile)
            budget_points.append((budget, d.saved_bytes, d.recompute_seconds))
        except Exception as error:  # informative only
            log.warning("PyTorch at activation_memory_budget=%s failed on %s: %s", budget, request.graph_id, error)
    return dict(
        baseline_budget_points=tuple(budget_points),
        baseline_simulated_peak_bytes=None if peak is None else peak.peak_bytes,
        baseline_simulated_peak_at=None if peak is None else f"{peak.peak_phase}:{peak.peak_node}",
        baseline_memory_timeline=() if peak is None else _timeline(peak),
        baseline_saved_bytes=described.saved_bytes,
        baseline_recompute_flops=described.recompute_flops,
        baseline_est_recompute_seconds=described.recompute_seconds,
        baseline_saved=described.saved,
        baseline_seconds=default_seconds,  # PyTorch's default partition alone (comparable to ours)
        _comparison_seconds=time.perf_counter() - start,  # everything spent on comparisons, not ours
    )


def _fxremat_partition(request: PartitionRequest, options: Options, profile: DeviceProfile):
    """Our passes, in order.  Returns (forward, backward, report fields)."""
    joint = request.joint
    _enter("prepare")
    joint = prepare_joint_graph(joint)  # a new graph: request.joint stays as it came, for the fallback
    _enter("classify")
    roles = classify(
        joint,
        num_fwd_outputs=request.num_fwd_outputs,
        static_lifetime_input_indices=request.static_lifetime_input_indices,
    )
    fields: dict = dict(
        never_recomputed=never_recomputed_counts(
            {n: r for n, r in roles.no_recompute.items() if roles.role[n] is not Role.INPUT}
        ),
        tag_conflicts=tuple((n.name, why) for n, why in roles.tag_conflicts.items()),
    )
    if not roles.has_backward:
        # Nothing for backward to read: the plain split, saving nothing.  (PyTorch's default_partition, which its
        # own partitioner uses here, asserts on a dead random op: the fuzzer found one.)
        fw, bw = split_or_fallback(
            joint,
            [],
            [],
            num_fwd_outputs=request.num_fwd_outputs,
            static_lifetime_input_nodes=roles.static_inputs,
        )
        return fw, bw, fields
    _enter("annotate_costs")
    costs = annotate_costs(joint.graph, profile)
    _enter("build_flow_problem")
    flow = build_flow_problem(roles, costs, profile)
    _enter("solve_min_cut")
    solve_start = time.perf_counter()

    def split(plan: Plan) -> tuple[fx.GraphModule, fx.GraphModule]:
        saved_nodes = [flow.nodes[i] for i in plan.saved]
        return split_or_fallback(
            joint,
            [n for n in saved_nodes if not tp.is_sym_node(n)],
            [n for n in saved_nodes if tp.is_sym_node(n)],
            num_fwd_outputs=request.num_fwd_outputs,
            static_lifetime_input_nodes=roles.static_inputs,
        )

    if options.peak_budget is None:
        plan, plan_fields = choose_plan(flow.parametric, options, profile, request.graph_id)
        split_done = None
    else:
        plan, plan_fields, split_done = _choose_plan_for_peak(flow, roles, joint, options, profile, request, split)
    fields.update(plan_fields)
    fields["solve_seconds"] = time.perf_counter() - solve_start
    recomputed_nodes = [flow.nodes[i] for i in plan.recomputed]
    for node in recomputed_nodes:
        if node in roles.no_recompute and roles.role[node] is not Role.BACKWARD_ONLY:
            raise AssertionError(f"solver recomputed a banned node: {node.format_node()}")
    fields["recompute_reasons"] = tuple(
        (n.name, _why_recomputed(n, roles.role[n])) for n in recomputed_nodes if roles.role[n] is Role.FORWARD
    )
    _enter("split")
    fw, bw = split_done if split_done is not None else split(plan)
    return fw, bw, fields


def _choose_plan_for_peak(flow, roles, joint, options: Options, profile: DeviceProfile, request, split):
    """The fastest candidate plan whose simulated activation peak fits ``peak_budget`` (and whose saved bytes fit
    ``memory_budget``, when both are given).  Candidates (``plan.peak_candidates``) are estimated at plan level
    (``plan_memory.py``, milliseconds each), and a shortlist of them is split and simulated (``simulate_step``).
    A float budget is a fraction of the way from the lowest simulated peak (0.0) to the default plan's (1.0)."""
    problem = flow.parametric
    memory = build_joint_memory(joint, roles, request.num_fwd_outputs)
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    value_node = [index[n] for n in flow.nodes]
    forward = [roles.role[n] is Role.FORWARD for n in flow.nodes]
    default_plan, fields = choose_plan(problem, options, profile, request.graph_id)  # memory_budget's plan if any
    candidates = peak_candidates(problem, forward, options, profile, fields.get("budget_bytes"))
    if "budget_bytes" in fields:
        candidates = [p for p in candidates if p.saved_bytes <= fields["budget_bytes"]]
    candidates = fastest_first([default_plan, *candidates])
    estimates = {
        plan_key(p): estimate_peak(memory, {value_node[v] for v in p.saved}).activation_peak_bytes for p in candidates
    }
    # The estimate is off by up to 26% on Llama (it leaves out Inductor's fusion order), so the choice is made on
    # real simulations of a shortlist alone; the shortlist does not depend on the budget, so a tighter budget only
    # removes plans and the peak found is monotone in the budget.
    shortlist = peak_shortlist(candidates, lambda p: estimates[plan_key(p)], default_plan, PEAK_SIMULATED_CANDIDATES)
    splits, real = {}, {}
    for plan in shortlist:
        # lazy modules: a candidate's code is generated only if it is the one chosen and then called (9 of 10
        # candidates' codegen was half of a peak-budget partition)
        with tp.lazy_graph_modules():
            splits[plan_key(plan)] = split(plan)
        # the default plan must simulate (its peak anchors a fraction); another candidate that cannot is dropped
        if plan_key(plan) == plan_key(default_plan):
            simulated = simulate_step(*splits[plan_key(plan)], request.num_fwd_outputs)
        else:
            simulated = _simulate(*splits[plan_key(plan)], request.num_fwd_outputs)
            if simulated is None:
                continue
        real[plan_key(plan)] = simulated.activation_peak_bytes
    shortlist = [p for p in shortlist if plan_key(p) in real]
    lowest = min(shortlist, key=lambda p: (real[plan_key(p)], p.seconds))
    budget = options.peak_budget
    if isinstance(budget, float):
        target = int(real[plan_key(lowest)] + budget * max(0, real[plan_key(default_plan)] - real[plan_key(lowest)]))
    else:
        target = budget
    fields.update(
        peak_budget=budget, peak_budget_bytes=target, peak_candidates=len(candidates), peak_simulated=len(shortlist)
    )
    chosen = next((p for p in shortlist if real[plan_key(p)] <= target), None)
    if chosen is not None:
        return chosen, dict(fields, peak_budget_met=True), splits[plan_key(chosen)]
    warnings.warn(
        f"fxremat: {request.graph_id} cannot keep its simulated activation peak within {target} bytes "
        f"(peak_budget={budget!r}); the lowest any candidate plan reaches is {real[plan_key(lowest)]} bytes. "
        "Using that plan.",
        FxrematBudgetWarning,
        stacklevel=3,
    )
    return lowest, dict(fields, peak_budget_met=False), splits[plan_key(lowest)]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while we partition, back on (if it was) afterwards.  A partition
    allocates tens of thousands of small objects (nodes, meta dicts, tuples); every few hundred allocations the
    collector runs, and its full collections walk every object the process holds (FakeTensors, the model, the
    graphs: 570k objects in benchmarks/solve_time.py at 48 blocks).  Those walks were most of the partition time
    there (the prepare pass: 0.95 s with the collector, 0.22 s without).  The reference cycles a partition leaves
    (graphs and their nodes) are collected once it resumes."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def partition(request: PartitionRequest, options: Options) -> tuple[fx.GraphModule, fx.GraphModule, CutReport]:
    with gc_paused():
        return _partition(request, options)


def _partition(request: PartitionRequest, options: Options) -> tuple[fx.GraphModule, fx.GraphModule, CutReport]:
    start = time.perf_counter()
    device_type, device_name = graph_device(request.joint)
    profile = options.profile_for(device_type, device_name)
    common = dict(
        graph_id=request.graph_id,
        num_joint_nodes=len(request.joint.graph.nodes),
        device_profile=profile.name,
        memory_price=options.memory_price,
        memory_budget=options.memory_budget,
        torch_version=torch.__version__,
    )
    baseline = _baseline(request, profile, options.compare_budgets) if options.compare_default else {}
    comparison_seconds = baseline.pop("_comparison_seconds", 0.0)
    fallback_reason = None
    fields: dict = {}
    try:
        fw, bw, fields = _fxremat_partition(request, options, profile)
        _enter("describe")
        described = describe_split(fw, bw, request.num_fwd_outputs, profile)
    except Exception as error:
        if options.strict:
            raise
        fallback_reason = f"{type(error).__name__}: {error}"
        fields = {}
    if fallback_reason is not None:
        warnings.warn(
            f"fxremat: partitioning {request.graph_id} failed ({fallback_reason}); using PyTorch's default "
            "partitioner for this graph. Pass strict=True to fxremat.backend to raise instead.",
            FxrematFallbackWarning,
            stacklevel=2,
        )
        fw, bw = tp.pytorch_default_partition(
            request.joint,
            request.joint_inputs,
            num_fwd_outputs=request.num_fwd_outputs,
            static_lifetime_input_indices=request.static_lifetime_input_indices,
        )
        described = describe_split(fw, bw, request.num_fwd_outputs, profile)
    report = CutReport(
        **common,
        **describe_fields(described),
        **_peak_fields(_simulate(fw, bw, request.num_fwd_outputs)),
        **fields,
        **baseline,
        partition_seconds=time.perf_counter() - start - comparison_seconds,
        fallback_reason=fallback_reason,
    )
    log.debug(
        "partition %s: saved %d bytes (default %s), %.3fs",
        request.graph_id,
        report.saved_bytes,
        report.baseline_saved_bytes,
        report.partition_seconds,
    )
    return fw, bw, report
