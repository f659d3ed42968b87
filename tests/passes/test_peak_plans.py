"""Peak-aware plans: the plan-level memory estimate equals the simulation of the real split on every candidate, and a
peak budget finds checkpointed plans whose activation peak grows like sqrt(N) on a stack of N blocks."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from helpers import assert_grads_close, capture_joint, eager_grads, run_fxremat_aot

from fxremat.examples import Stack, example
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.costs import PROFILES, annotate_costs
from fxremat_passes.graph.flow_problem import build_flow_problem
from fxremat_passes.graph.roles import classify
from fxremat_passes.rewrite.cpp_units import join_kernel_runs
from fxremat_passes.simulator.liveness import simulate_step
from fxremat_passes.simulator.plan_memory import build_joint_memory, estimate_peak
from fxremat_passes.solver.budget import frontier


def _candidates_and_memory(name):
    from fxremat.options import Options
    from fxremat_passes.choice.plan import peak_candidates
    from fxremat_passes.choice.settings import prices
    from fxremat_passes.graph.roles import Role
    from fxremat_passes.solver.budget import SolveCache

    model, inputs = example(name)
    gm, kwargs = capture_joint(model, inputs)
    num_fwd_outputs = kwargs["num_fwd_outputs"]
    joint = tp.prepare_joint_graph(gm)
    roles = classify(joint, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=None)
    profile = PROFILES["cpu"]
    flow = build_flow_problem(roles, annotate_costs(joint.graph, profile), profile)
    forward = [roles.role[n] is Role.FORWARD for n in flow.nodes]
    # the candidates a peak-aware choice ranks (passes/choice/judged.py, ranked_candidates)
    price_range = prices(Options.create(), profile)
    plans = peak_candidates(flow.parametric, forward, price_range, None, SolveCache(flow.parametric)).every()
    if name == "convnet":  # no checkpoint grid there: the bytes frontier
        plans += frontier(flow.parametric, 0.0, 1e6 / profile.mem_bandwidth)
    return joint, roles, flow, plans, build_joint_memory(joint, roles, num_fwd_outputs), num_fwd_outputs


def _split(joint, roles, saved, num_fwd_outputs):
    """The real split of the plan saving ``saved`` (joint nodes)."""
    return tp.split_with_saved_values(
        joint,
        [n for n in saved if not tp.is_sym_node(n)],
        [n for n in saved if tp.is_sym_node(n)],
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=roles.static_inputs,
    )


@pytest.mark.parametrize("name", ["mlp", "block_sdpa", "stack", "llama_stack", "convnet"])
def test_plan_estimate_is_the_simulation_of_the_split(name):
    """The plan-level estimate runs the simulation itself over the split it would make (plan_memory.py): equal to
    ``simulate_step`` of the real split on every candidate plan, step peak and activation peak alike (before: up to
    29% off on llama_stack's step peak at batch 2, seq 128, dim 192)."""
    joint, roles, flow, plans, memory, num_fwd_outputs = _candidates_and_memory(name)
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    assert len(plans) >= 2, name
    for plan in plans:
        saved = [flow.nodes[v] for v in plan.saved]
        fw, bw = _split(joint, roles, saved, num_fwd_outputs)
        simulated = simulate_step(fw, bw, num_fwd_outputs)
        estimated = estimate_peak(memory, {index[n] for n in saved})
        assert (estimated.peak_bytes, estimated.activation_peak_bytes) == (
            simulated.peak_bytes,
            simulated.activation_peak_bytes,
        ), (name, plan.saved_bytes)
        assert estimated.timeline == simulated.timeline, (name, plan.saved_bytes)


@pytest.mark.parametrize("name", ["block_sdpa", "llama_stack"])
def test_plan_estimate_in_the_order_inductor_gets_is_the_simulation_of_the_reordered_split(name):
    """With ``SimulatorInputs.joins_kernel_runs`` (fxremat's partition under Inductor on CPU) a plan's estimate is the
    step of its backward as ``cpp_units.join_kernel_runs`` will reorder it: equal to the simulation of the real split
    once reordered, on every candidate plan, and never above the estimate in the split's own order."""
    joint, roles, flow, plans, memory, num_fwd_outputs = _candidates_and_memory(name)
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    reordered = 0
    joined = dataclasses.replace(memory, simulator=memory.simulator.with_changes(joins_kernel_runs=True))
    for plan in plans:
        saved = [flow.nodes[v] for v in plan.saved]
        fw, bw = _split(joint, roles, saved, num_fwd_outputs)
        own = estimate_peak(memory, {index[n] for n in saved})
        estimated = estimate_peak(joined, {index[n] for n in saved})
        reordered += join_kernel_runs(fw, bw, num_fwd_outputs).reordered
        simulated = simulate_step(fw, bw, num_fwd_outputs)  # the graph as it now is, never reordered again
        assert estimated.timeline == simulated.timeline, (name, plan.saved_bytes)
        assert estimated.peak_bytes <= own.peak_bytes, (name, plan.saved_bytes)
    assert reordered > 0, name  # else this proves nothing


def test_estimates_share_what_their_phases_have_in_common():
    """The estimates of one joint graph keep their phases' node computations, unit summaries and fusions
    (``NodeFacts.computations``) under keys holding all each reads: estimating again makes nothing new, some plans
    find a phase's whole fusion made by another's, and an estimate made after all the others equals the one made
    first on a fresh joint memory."""
    joint, roles, flow, plans, memory, num_fwd_outputs = _candidates_and_memory("stack")
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    saved_sets = [{index[flow.nodes[v]] for v in plan.saved} for plan in plans]
    warm = [estimate_peak(memory, saved) for saved in saved_sets]
    known = memory.node_facts.computations
    kept = len(known)
    assert [estimate_peak(memory, saved).timeline for saved in saved_sets] == [e.timeline for e in warm]
    assert len(known) == kept
    fusions = sum(1 for key in known if key[0] == "fused")
    assert 0 < fusions < 2 * len(saved_sets), (fusions, len(saved_sets))
    for position in (0, -1):
        cold = estimate_peak(build_joint_memory(joint, roles, num_fwd_outputs), saved_sets[position])
        assert cold.timeline == warm[position].timeline, position


@functools.lru_cache(maxsize=None)  # two tests read the same 12-block reports
def _lowest_peak(blocks: int) -> tuple:
    """(peak_budget=0.0, memory_budget=0.0 without and with backward segments, default) reports on a stack;
    gradients checked."""
    torch.manual_seed(0)
    model, inputs = Stack(blocks, dim=32, heads=2), (torch.randn(2, 16, 32),)
    _, expected = eager_grads(model, inputs)
    peaks = []
    settings = (dict(peak_budget=0.0), dict(memory_budget=0.0, backward_segments=False), dict(memory_budget=0.0), {})
    for options in settings:
        _, grads, _, reports = run_fxremat_aot(model, inputs, strict=True, compare_default=False, **options)
        assert_grads_close(grads, expected)
        peaks.append(reports[0])
    return tuple(peaks)


def test_tightest_peak_budget_grows_like_sqrt_n():
    """The classic result: checkpoints every ~sqrt(N) blocks.  Four times the blocks must cost at most about twice
    the activation peak (sqrt(4) = 2; linear growth would be 4x) on the lowest-peak plans (peak_budget=0.0, and
    memory_budget=0's segmented backward, passes/rewrite/segments.py), while the fewest-bytes plan with a plain backward
    recomputes the whole forward at the start of backward and grows linearly.  And peak_budget=0.0 is what its name
    says: no setting reaches a lower simulated step peak (gradients included)."""
    reports = {n: _lowest_peak(n) for n in (3, 12)}
    activation = {n: [r.simulated_activation_peak_bytes for r in reports[n]] for n in reports}
    (lowest_3, fewest_3, segmented_3, _), (lowest_12, fewest_12, segmented_12, default_12) = activation.values()
    best_3, best_12 = min(lowest_3, segmented_3), min(lowest_12, segmented_12)
    # measured: best 112,128 -> 218,368 B (1.95x), fewest-bytes 3.77x; at 12, best / fewest 0.27, / default 0.46.
    # Segmentations are ranked by the step peak since session 23 (passes/rewrite/segments.py): at 12 blocks the one with
    # 181,504 B of activations (0.22 of the fewest-bytes plan's) has the same step peak, 634,240 B, and more FLOPs.
    assert best_12 <= 2.0 * best_3, (best_3, best_12)
    assert fewest_12 >= 3.4 * fewest_3, (fewest_3, fewest_12)  # the failure mode, for contrast: ~linear
    assert best_12 < 0.3 * fewest_12 and best_12 < 0.5 * default_12, (best_12, fewest_12, default_12)
    for n, runs in reports.items():
        step = [r.simulated_peak_bytes for r in runs]
        assert step[0] == min(step), (n, step)


def test_budget_zero_stays_near_the_lowest_step_peak():
    """Issue #15: memory_budget=0.0 (segmented backward, by default) within 1.25x the step peak of peak_budget=0.0
    on a 12-block stack (measured: 0.98x; its activation peak is 1.47x, the gradients' timing differs)."""
    lowest, plain, segmented, _ = (r.simulated_peak_bytes for r in _lowest_peak(12))
    assert segmented <= 1.25 * lowest < plain, (segmented, lowest, plain)


def test_peak_budget_zero_is_never_above_a_memory_budget_setting():
    """Issue #15: peak_budget=0.0 is the lowest setting.  memory_budget's walk segments the lowest plans of each
    saved-bytes level it passes; peak_budget's last resort must judge those too (llama_stack: memory_budget=0.2
    segments a plan to 769,280 B simulated; peak_budget=0.0 had stopped at 801,536)."""
    model, inputs = example("llama_stack")
    _, expected = eager_grads(model, inputs)
    peaks = {}
    for setting in ({"peak_budget": 0.0}, *({"memory_budget": b} for b in (1.0, 0.5, 0.2, 0.0))):
        _, grads, _, reports = run_fxremat_aot(model, inputs, strict=True, **setting)
        assert_grads_close(grads, expected)
        peaks[str(setting)] = reports[0].simulated_peak_bytes
    assert peaks["{'peak_budget': 0.0}"] == min(peaks.values()), peaks


def test_report_text_says_what_was_asked_and_achieved():
    import fxremat

    model, inputs = example("stack")
    report = run_fxremat_aot(model, inputs, strict=True, memory_budget=0.5, peak_budget="1GiB")[3][0]
    text = fxremat.format_text(report)
    assert report.peak_budget_met and report.budget_met
    assert report.peak_budget_bytes == 2**30 and report.saved_bytes <= report.budget_bytes
    assert "peak_budget 1073741824: step peak at most 1.00 GiB" in text and "(met;" in text
    budget_bytes = fxremat.render.format_bytes(report.budget_bytes)
    assert f"memory_budget 0.5 (from fxremat): at most {budget_bytes} saved" in text
    assert text.count("simulated step peak") == 1 and report.simulated_peak_at in text


@pytest.mark.parametrize("setting", [{"peak_budget": 0.0}, {"memory_budget": 0.2}, {}])
def test_the_report_names_the_method_that_found_the_chosen_plan(monkeypatch, setting):
    """``plan_method`` is the chosen plan's: peak_budget=0.0 on the 4-block stack chooses a checkpointed plan, which
    its report called "mincut" (the default plan's method, written before the peak choice) until session 20."""
    from fxremat import partition as partition_module

    chosen = []
    real_choose = partition_module.choose
    monkeypatch.setattr(partition_module, "choose", lambda *a: chosen.append(real_choose(*a)) or chosen[-1])
    model, inputs = example("stack")
    report = run_fxremat_aot(model, inputs, strict=True, **setting)[3][0]
    assert [c.plan.method for c in chosen] == [report.plan_method], (chosen, report.plan_method)
    if setting == {"peak_budget": 0.0}:
        # the case that was wrong: not the price search's plan (a checkpointed one until session 23's ranking of
        # segmentations by the step peak, a MILP one since)
        assert report.plan_method in ("checkpoints", "milp"), report.plan_method


def test_the_candidates_between_the_vertices_save_the_block_sums_and_peak_no_higher():
    """``refinements_of(..., sums_problem)`` (passes/choice/plan.py): the MILP-refined candidates are solved with
    the block sums' saves priced at one read, as the default plan may be, and priced back on the real problem; each
    fits its fraction's bytes, and saving the residual stream spares backward recomputing it, so none peaks above
    the plain problem's plan at the same fraction, and at least one saves a block sum (llama_stack, RESULTS.md
    "Session 21": the plain plans peaked above the default, and memory_budget=0.5 fell back to a slow one)."""
    from fxremat.options import Options
    from fxremat_passes.choice.plan import PEAK_CANDIDATE_FRACTIONS, budget_target_bytes, refinements_of
    from fxremat_passes.choice.settings import prices
    from fxremat_passes.graph.stored_sums import block_sums, reads_only
    from fxremat_passes.solver.budget import SolveCache

    joint, roles, flow, _, memory, _ = _candidates_and_memory("llama_stack")
    problem, profile, options = flow.parametric, PROFILES["cpu"], Options.create()
    sums = block_sums(roles, flow.nodes)
    assert sums
    sums_problem = reads_only(problem, sums, profile.mem_bandwidth)
    price_range = prices(options, profile)
    plain = refinements_of(problem, price_range, SolveCache(problem)).every()
    with_sums = refinements_of(problem, price_range, SolveCache(problem), sums_problem).every()
    index = {n: i for i, n in enumerate(joint.graph.nodes)}

    def peak(plan) -> int:
        return estimate_peak(memory, {index[flow.nodes[v]] for v in plan.saved}).peak_bytes

    default = max(plain, key=lambda p: p.saved_bytes)
    fewest = min(plain, key=lambda p: p.saved_bytes)
    saved_a_sum = False
    for fraction in PEAK_CANDIDATE_FRACTIONS:
        target = budget_target_bytes(fraction, default, fewest)
        ours = min((p for p in with_sums if p.saved_bytes <= target), key=lambda p: p.seconds)
        theirs = min((p for p in plain if p.saved_bytes <= target), key=lambda p: p.seconds)
        assert ours.seconds == pytest.approx(problem.seconds(ours.saved, ours.recomputed))
        assert peak(ours) <= peak(theirs), fraction
        saved_a_sum |= bool(set(ours.saved) & set(sums))
    assert saved_a_sum


@pytest.mark.parametrize("budget", [0.5, 0.2])
def test_the_candidates_hold_the_cheapest_plan_at_the_budgets_users_set_most(budget):
    """``memory_budget`` 0.5 and 0.2 (PyTorch users' usual ``activation_memory_budget`` values) each find the
    cheapest plan within their cap among the candidates (``PEAK_CANDIDATE_FRACTIONS``): without it the walk takes
    the next refined plan below the cap, and at 0.2 on the benchmark stack that was a plan recomputed segment by
    segment, 1.13x PyTorch's step (benchmarks/RESULTS.md "Session 22")."""
    from fxremat.options import Options
    from fxremat_passes.choice.plan import budget_target_bytes, refinements_of
    from fxremat_passes.choice.settings import prices
    from fxremat_passes.solver.budget import SolveCache
    from fxremat_passes.solver.solvers import Budget, cheapest_within

    _, _, flow, _, _, _ = _candidates_and_memory("stack")
    problem, profile, options = flow.parametric, PROFILES["cpu"], Options.create()
    cache = SolveCache(problem)
    price, max_price = prices(options, profile)
    plans = refinements_of(problem, (price, max_price), cache).every()
    default = max(plans, key=lambda p: p.saved_bytes)
    fewest = min(plans, key=lambda p: p.saved_bytes)
    target = budget_target_bytes(budget, default, fewest)
    cheapest, met = cheapest_within(problem, price, Budget(target, max_price, default, fewest), cache)
    assert met
    within = [p for p in plans if p.saved_bytes <= target]
    assert min(p.seconds for p in within) <= cheapest.seconds * (1 + 1e-9)
