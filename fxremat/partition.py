"""The partition function: the passes in order, the PyTorch baseline for the report, and the fallback.

    prepare -> classify -> annotate_costs -> build_flow_problem -> solve_min_cut -> split -> describe

The report's simulated peak (a liveness simulation of the step) is left for the first read of its fields
(``fxremat/simulated.py``): the partition hands back graphs and a report whose simulation has not run yet.

Any exception inside our passes: one warning naming the graph and the cause, then PyTorch's default partitioner
(with its own defaults) for that graph, and ``fallback_reason`` in the report; ``strict=True`` raises instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import offload as tp_offload
from fxremat_passes.choice import ChoiceSettings, choose, kept_tagged, segmented_split
from fxremat_passes.graph.costs import DeviceProfile, annotate_costs
from fxremat_passes.graph.cse import MetaSnapshot, prepare_joint_graph
from fxremat_passes.graph.flow_problem import VALUE_ROLES, build_flow_problem
from fxremat_passes.graph.graph_facts import attach as attach_graph_facts
from fxremat_passes.graph.phase_copies import copy_gathers_per_phase
from fxremat_passes.graph.region_budget import annotations_hidden
from fxremat_passes.graph.roles import Policy, Role, classify, recompute_tag
from fxremat_passes.rewrite.cpp_units import join_kernel_runs
from fxremat_passes.rewrite.describe import describe_split, step_seconds
from fxremat_passes.rewrite.layout_choice import LayoutChoice, decide_layout
from fxremat_passes.rewrite.layout_pins import pin_as_strided_inputs, saved_inputs_as_views
from fxremat_passes.rewrite.split import SplitRecipe, split_with_recipe
from fxremat_passes.simulator.inputs import SimulatorInputs
from fxremat_passes.simulator.layout import has_convolution
from fxremat_passes.simulator.liveness import PeakEstimate, saved_views_of_inputs
from fxremat_passes.solver.budget import Plan

from . import recording, simulated
from .compile_inputs import graph_device, simulator_inputs
from .deferred import Deferred
from .knobs import TORCH_CONFIG_SOURCE, effective_options
from .loss_choice import loss_split
from .options import Options
from .report import (
    BASELINE_PEAK_FIELDS,
    Baseline,
    Choice,
    Classified,
    CompileFacts,
    CutReport,
    Described,
    Layout,
    LossRegions,
    Outcome,
    Recomputation,
    SimulatedPeak,
    build_report,
    given,
)

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
    inductor: bool = False  # Inductor compiles the split (not aot_eager, not no-op compilers): its layout rules apply
    # the compile's layout decision, where fxremat may choose it (a CPU graph, no layout switch of the user's)
    layout: LayoutChoice | None = None
    # what every simulation of this partition assumes (``simulator_inputs``), set as the partition starts unless given
    # (a replay gives the recorded inputs: fxremat/replay.py)
    simulator: SimulatorInputs | None = None


def _why_recomputed(node: fx.Node, checkpoints: str) -> str:
    if recompute_tag(node) == Policy.MUST_RECOMPUTE:
        return "tagged MUST_RECOMPUTE"
    if recompute_tag(node) == Policy.PREFER_RECOMPUTE:
        # honoured: the user's checkpoint (passes/choice/contract.py); replan: the tag's bias made it the cheaper side
        return (
            "tagged PREFER_RECOMPUTE, honoured" if checkpoints == "honour" else "tagged PREFER_RECOMPUTE, and cheaper"
        )
    return "cheaper to recompute than to keep"


def _plan_fields(plan: Plan, flow, roles, options: Options) -> Recomputation:
    """Why each forward node is recomputed, and which checkpointed values are kept (``contract.kept_tagged``)."""
    recomputed = (flow.nodes[i] for i in plan.recomputed)
    return Recomputation(
        recompute_reasons=tuple(
            (n.name, _why_recomputed(n, options.checkpoints)) for n in recomputed if roles.role[n] is Role.FORWARD
        ),
        checkpoint_kept=kept_tagged(plan, flow, roles, options.checkpoints),
    )


# PyTorch's activation_memory_budget values shown beside fxremat's frontier (compare_budgets).
PYTORCH_BUDGETS = (0.5, 0.1, 0.0)


def _baseline(request: PartitionRequest, profile: DeviceProfile, compare_budgets: bool = False):
    """PyTorch's default partition of the same joint graph, for the report: (its record, the seconds every
    comparison took, which the partition's own time leaves out)."""
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
        return Baseline(baseline_error=f"{type(error).__name__}: {error}"), 0.0  # its time counted as ours, as before
    default_seconds = time.perf_counter() - start
    # PyTorch's split is ours alone (nobody compiles it): simulated on the first read of its fields
    # as stock Inductor compiles it: its buffer reuse, saved inputs kept as its channels-last copies (``recopy=False``)
    stock = simulator_inputs(request, stock=True, caller_bytes=request.simulator.caller_bytes)
    if simulated.can_simulate_later(fw.graph.nodes):
        baseline_peak = simulated.later(
            lambda: simulated.baseline_peak_fields(
                simulated.simulate_step(fw, bw, request.num_fwd_outputs, recopy=False, inputs=stock)
            ),
            BASELINE_PEAK_FIELDS,
        )
    else:
        baseline_peak = simulated.baseline_peak_fields(
            simulated.simulate_or_none(fw, bw, request.num_fwd_outputs, recopy=False, inputs=stock)
        )
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
    baseline = Baseline(
        **baseline_peak,
        baseline_budget_points=tuple(budget_points),
        baseline_saved_bytes=described.saved_bytes,
        baseline_recompute_flops=described.recompute_flops,
        baseline_est_recompute_seconds=described.recompute_seconds,
        baseline_saved=described.saved,
        baseline_seconds=default_seconds,  # PyTorch's default partition alone (comparable to ours)
    )
    return baseline, time.perf_counter() - start


@dataclass
class _Split:
    """Our split of a joint graph, and what its report's simulation can start from."""

    fw: fx.GraphModule
    bw: fx.GraphModule
    records: list  # the report's stage records (fxremat/report.py) made on the way
    recipe: SplitRecipe | None = None  # None where PyTorch's extraction made the split
    peak: PeakEstimate | None = None  # the split's simulation, where choosing the plan ran it already


def _keep_convolutions_for_depthwise(joint: fx.GraphModule, roles, inputs: SimulatorInputs) -> None:
    """Under Inductor, a convolution recomputed in backward can cost mkldnn's depthwise buffer (docs/DESIGN.md §7): such
    convolutions join the never-recomputed nodes; a user's recompute tag is honoured."""
    untagged = [n for n, r in roles.role.items() if r is Role.FORWARD and recompute_tag(n) is None]
    for node, why in inputs.backend.convolutions_kept(joint, untagged, inputs).items():
        roles.no_recompute.setdefault(node, why)


def _fxremat_partition(request: PartitionRequest, options: Options, profile: DeviceProfile, regions=None) -> _Split:
    """Our passes, in order (``regions``: the graph's per-region budgets, ``knobs.effective_options``)."""
    joint = request.joint
    _enter("prepare")
    joint = prepare_joint_graph(joint)  # request.joint itself, cleaned up (see _partition's snapshot)

    def cut(joint: fx.GraphModule, loss: LossRegions) -> _Split:
        return _cut(joint, request, options, profile, regions, loss)

    # the loss region chunked before the cut, which then prices the chunked gradients (DESIGN §14)
    return loss_split(joint, request, options, profile, cut)


def _cut(joint: fx.GraphModule, request: PartitionRequest, options: Options, profile, regions, loss) -> _Split:
    """The passes from the prepared (and chunked) joint to its split (``loss``: the loss regions' report record)."""
    copy_gathers_per_phase(joint, request.num_fwd_outputs)  # so no plan makes Inductor store one for two readers
    attach_graph_facts(joint, request.num_fwd_outputs)  # the one view of the joint graph every pass reads (roles.facts)
    _enter("classify")
    roles = classify(
        joint,
        num_fwd_outputs=request.num_fwd_outputs,
        static_lifetime_input_indices=request.static_lifetime_input_indices,
    )
    if request.inductor:
        _keep_convolutions_for_depthwise(joint, roles, request.simulator)
    reasons = Counter(r for n, r in roles.no_recompute.items() if roles.role[n] is not Role.INPUT)
    classified = Classified(
        never_recomputed=tuple(sorted(reasons.items())),
        tag_conflicts=tuple((n.name, why) for n, why in roles.tag_conflicts.items()),
    )
    if not roles.has_backward:
        # Nothing for backward to read: the plain split, saving nothing.  (PyTorch's default_partition, which its
        # own partitioner uses here, asserts on a dead random op: the fuzzer found one.)
        fw, bw, recipe = split_with_recipe(
            joint,
            [],
            [],
            num_fwd_outputs=request.num_fwd_outputs,
            static_lifetime_input_nodes=roles.static_inputs,
        )
        return _Split(fw, bw, [classified, loss], recipe)
    _enter("annotate_costs")
    # the values the cut decides on; backward's own nodes are never priced by it (half the graph)
    costs = annotate_costs(joint.graph, profile, [n for n, r in roles.role.items() if r in VALUE_ROLES], roles.facts)
    _enter("build_flow_problem")
    flow = build_flow_problem(roles, costs, profile)
    _enter("solve_min_cut")
    solve_start = time.perf_counter()
    split = _splitter(joint, flow, roles, request.num_fwd_outputs)
    chosen = choose(flow, roles, joint, ChoiceSettings.of(options), profile, request, split, regions, request.simulator)
    plan, split_done, peak = chosen.plan, chosen.split, chosen.peak
    choice = Choice(**chosen.fields, solve_seconds=time.perf_counter() - solve_start)  # the choice modules' dict
    for node in (flow.nodes[i] for i in plan.recomputed):
        if node in roles.no_recompute and roles.role[node] is not Role.BACKWARD_ONLY:
            raise AssertionError(f"solver recomputed a banned node: {node.format_node()}")
    recomputation = _plan_fields(plan, flow, roles, options)
    _enter("split")
    fw, bw, recipe = split_done if split_done is not None else split(plan)
    if options.offload is True and choice.offloaded:
        _offload(fw, bw, choice.offloaded)
    if options.backward_segments and recipe is not None and not recipe.bw_checkpoints:  # asked for every plan
        (fw, bw, recipe), peak, segment_fields = segmented_split(
            recipe, request.num_fwd_outputs, profile, request.simulator
        )
        choice = dataclasses.replace(choice, **segment_fields)  # this split's segments, not the choice's
    return _Split(fw, bw, [classified, loss, choice, recomputation], recipe, peak)


def _offload(fw: fx.GraphModule, bw: fx.GraphModule, rows) -> None:
    """PyTorch's rewrite on the planned storages, each wait and reload where the report's rows place them
    (``Choice.offloaded``, docs/DESIGN.md §16)."""
    waits = {name: wait for name, _, _, wait, _ in rows}
    reloads = {name: reload for name, _, _, _, reload in rows}
    tp_offload.rewrite_offloads(fw, bw, list(waits), waits, reloads)


def _splitter(joint: fx.GraphModule, flow, roles, num_fwd_outputs: int):
    """plan -> (fw, bw, recipe): the split that saves ``plan.saved`` (symbolic sizes apart from tensors)."""

    def split(plan: Plan) -> tuple[fx.GraphModule, fx.GraphModule, SplitRecipe | None]:
        saved_nodes = [flow.nodes[i] for i in plan.saved]
        return split_with_recipe(
            joint,
            [n for n in saved_nodes if not tp.is_sym_node(n)],
            [n for n in saved_nodes if tp.is_sym_node(n)],
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=roles.static_inputs,
        )

    return split


def partition(request: PartitionRequest, options: Options) -> tuple[fx.GraphModule, fx.GraphModule, CutReport]:
    recorder = recording.current()  # None unless a recording is in force (fxremat/recording.py)
    if recorder is not None:  # the joint graph as it came, before any pass touches it
        profile = options.profile_for(*graph_device(request.joint))
        simulator = request.simulator or simulator_inputs(request, caller_bytes=options.caller_bytes)
        recorder.fxremat_received(request, options, profile, simulator)
    with simulated.gc_paused():
        fw, bw, report = _partition(request, options)
    if recorder is not None:
        recorder.fxremat_partitioned(report)
    return fw, bw, report


def _fallback(request: PartitionRequest, profile: DeviceProfile, reason: str, torch_budget=1.0, regions=None):
    """PyTorch's default partition of the joint graph, with one warning: (fw, bw, its report records).  Its
    budget is the user's ``activation_memory_budget`` where fxremat took its budget from there (a region
    annotation PyTorch reads itself), else PyTorch's default."""
    warnings.warn(
        f"fxremat: partitioning {request.graph_id} failed ({reason}); using PyTorch's default "
        "partitioner for this graph"
        + (f" without its per-region budgets {list(regions.budgets)} (PyTorch's takes one)" if regions else "")
        + ". Pass strict=True to fxremat.backend to raise instead.",
        FxrematFallbackWarning,
        stacklevel=3,
    )
    fw, bw = tp.pytorch_default_partition(
        request.joint,
        request.joint_inputs,
        num_fwd_outputs=request.num_fwd_outputs,
        static_lifetime_input_indices=request.static_lifetime_input_indices,
        activation_memory_budget=torch_budget,
    )
    described = describe_split(fw, bw, request.num_fwd_outputs, profile)
    peak = simulated.simulate_or_none(fw, bw, request.num_fwd_outputs, inputs=request.simulator)
    step = _step_seconds(fw, bw, None, profile)
    return fw, bw, [Described.of(described, step), SimulatedPeak(**simulated.peak_fields(peak))]


def _choose_layout(request: PartitionRequest, fw: fx.GraphModule, bw: fx.GraphModule, peak: SimulatedPeak):
    """The layout Inductor gets for our split of a CPU graph with convolutions (``layout_choice.py``): (the report's
    simulated peak under it, the layout's record).  A simulation that fails leaves the contiguous layout, logged."""
    contiguous = given(peak, "simulated_peak_bytes")
    if not isinstance(contiguous, int):  # the simulation failed (or is deferred)
        return peak, Layout()
    try:
        channels_last = decide_layout(request.layout, fw, bw, request.num_fwd_outputs, contiguous, request.simulator)
    except Exception as error:
        log.debug("channels-last simulation failed, the layout stays contiguous: %s", error, exc_info=True)
        request.layout.channels_last, request.layout.peaks = None, None
        return peak, Layout()
    layout = Layout(
        inductor_layout="channels_last" if request.layout.channels_last else "contiguous",
        layout_simulated_peaks=request.layout.peaks,
    )
    return (peak if channels_last is None else SimulatedPeak(**simulated.peak_fields(channels_last))), layout


def _ready_for_compiler(request: PartitionRequest, fw: fx.GraphModule, bw: fx.GraphModule) -> None:
    """What any split (ours or PyTorch's) needs before the compiler gets it."""
    pin_as_strided_inputs(bw)  # as_strided reads independent of saved layouts (docs/DESIGN.md §7)
    # parameters saved, not Inductor's layout copies of them (docs/DESIGN.md §7), in the chosen layout
    if request.inductor:
        saved_inputs_as_views(fw, bw, request.num_fwd_outputs, _simulator_in_layout(request))
    tp.mark_inputs_never_freed(bw, saved_views_of_inputs(fw, bw, request.num_fwd_outputs))


def _partition(request: PartitionRequest, options: Options) -> tuple[fx.GraphModule, fx.GraphModule, CutReport]:
    start = time.perf_counter()
    if request.simulator is None:  # a replay names the recorded inputs (fxremat/replay.py)
        request = dataclasses.replace(request, simulator=simulator_inputs(request, caller_bytes=options.caller_bytes))
    # a user's setting, not a fault of ours: bad region annotations raise here, outside the fallback
    options, budget_source, regions = effective_options(options, request.joint, request.num_fwd_outputs)
    device_type, device_name = graph_device(request.joint)
    profile = options.profile_for(device_type, device_name)
    common = CompileFacts(
        graph_id=request.graph_id,
        num_joint_nodes=len(request.joint.graph.nodes),
        device_profile=profile.name,
        memory_price=options.memory_price,
        memory_budget=options.memory_budget,
        memory_budget_source=budget_source,
        torch_version=torch.__version__,
    )
    baseline, comparison_seconds = Baseline(), 0.0
    if options.compare_default:  # PyTorch's partitioner refuses per-region budgets: its default, without them
        with annotations_hidden(request.joint, hide=regions is not None):
            baseline, comparison_seconds = _baseline(request, profile, options.compare_budgets)
    # our passes mark the joint's own nodes (prepare cleans it up in place, as PyTorch does): a fallback gets their
    # meta back as it came
    joint_meta = MetaSnapshot(request.joint.graph)
    try:
        fw, bw, records = _ours_described(request, options, profile, regions)
        report = build_report(common, baseline, *records)  # a field made twice is our bug: inside the fallback
    except Exception as error:
        joint_meta.restore()
        if options.strict:
            raise
        fallback_reason = f"{type(error).__name__}: {error}"
        torch_budget = options.memory_budget if budget_source == TORCH_CONFIG_SOURCE else 1.0
        with annotations_hidden(request.joint, hide=regions is not None):  # not applied, and the warning says so
            fw, bw, records = _fallback(request, profile, fallback_reason, torch_budget, regions)
        report = build_report(common, baseline, *records, Outcome(fallback_reason=fallback_reason))
    _ready_for_compiler(request, fw, bw)
    seconds = time.perf_counter() - start - comparison_seconds
    report = report.with_changes(partition_seconds=seconds)  # the deferred fields stay deferred
    log.debug("partition %s: saved %d bytes, %.3fs", request.graph_id, report.saved_bytes, seconds)
    return fw, bw, report


def _ours_described(request: PartitionRequest, options: Options, profile: DeviceProfile, regions):
    """fxremat's split and every report record it makes: (fw, bw, records).  Under Inductor on CPU every step is
    simulated with the backward in the order ``_fewer_cpp_units`` will give it
    (``SimulatorInputs.joins_kernel_runs``)."""
    ours = _fxremat_partition(request, options, profile, regions)
    fw, bw = ours.fw, ours.bw
    _enter("describe")
    described = describe_split(fw, bw, request.num_fwd_outputs, profile)
    peak = simulated.report_peak(fw, bw, request.num_fwd_outputs, ours.recipe, ours.peak, request.simulator)
    layout = Layout()
    if request.layout is not None and has_convolution(fw):
        peak, layout = _choose_layout(request, fw, bw, peak)
    peak = _fewer_cpp_units(request, fw, bw, peak)
    step = _step_seconds(fw, bw, ours.recipe, profile)
    return fw, bw, [Described.of(described, step), peak, *ours.records, layout]


def _step_seconds(fw: fx.GraphModule, bw: fx.GraphModule, recipe: SplitRecipe | None, profile: DeviceProfile):
    """The report's ``est_step_seconds``: deferred to its first read where a recipe can build the split again
    (Inductor rewrites the graphs it gets, as the simulated peaks' deferral says), else priced now."""
    if recipe is None:
        return step_seconds([*fw.graph.nodes, *bw.graph.nodes], profile)

    def compute() -> dict:
        try:
            fw_again, bw_again = recipe.build(lazy=True)
            return {"est_step_seconds": step_seconds([*fw_again.graph.nodes, *bw_again.graph.nodes], profile)}
        except Exception as error:  # informative: a failure leaves the field null, logged
            log.debug("est_step_seconds failed: %s", error, exc_info=True)
            return {}

    return Deferred(compute)


def _simulator_in_layout(request: PartitionRequest) -> SimulatorInputs:
    """The partition's simulator inputs in the layout Inductor gets (``LayoutChoice``: where the partitioner chose)."""
    return request.layout.simulator_inputs(request.simulator) if request.layout else request.simulator


def _joins_cpp_units(request: PartitionRequest) -> bool:
    return request.simulator.joins_kernel_runs


def _fewer_cpp_units(request: PartitionRequest, fw: fx.GraphModule, bw: fx.GraphModule, peak: SimulatedPeak):
    """Under Inductor on CPU, the backward reordered for fewer C++ units or a lower simulated peak (in the layout
    Inductor gets), neither rising (``cpp_units.py``): the order the plan was judged in.  Reordered, the report's peak
    is the simulation of the new order (the recipe's copy of the split, which a deferred peak simulates, has the
    order before); else it stays as it was (deferred where it was)."""
    if not _joins_cpp_units(request):
        return peak
    joined = join_kernel_runs(fw, bw, request.num_fwd_outputs, _simulator_in_layout(request))
    return SimulatedPeak(**simulated.peak_fields(joined.estimate)) if joined.reordered else peak
