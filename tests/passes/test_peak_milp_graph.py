"""The joint graph as the peak MILP's schedule graph (passes/simulator/peak_milp_graph.py): exact reductions, merging to a
node limit that never swallows a saved value, and fxremat's frontier plans evaluated on it."""

from __future__ import annotations

import operator

import pytest
from helpers import capture_joint

from fxremat.examples import example
from fxremat_passes.graph.costs import PROFILES, alias_root, annotate_costs
from fxremat_passes.graph.cse import prepare_joint_graph
from fxremat_passes.graph.flow_problem import VALUE_ROLES, build_flow_problem
from fxremat_passes.graph.roles import classify
from fxremat_passes.simulator.peak_milp_graph import build_schedule_graph
from fxremat_passes.solver.budget import frontier
from fxremat_passes.solver.peak_milp import evaluate_plan, solve_min_peak


def _prepared(name: str):
    model, inputs = example(name, batch=2, seq=16, dim=32)
    gm, kwargs = capture_joint(model, inputs)
    joint = prepare_joint_graph(gm)
    roles = classify(joint, num_fwd_outputs=kwargs["num_fwd_outputs"], static_lifetime_input_indices=None)
    profile = PROFILES["cpu"]
    costs = annotate_costs(joint.graph, profile, [n for n, r in roles.role.items() if r in VALUE_ROLES])
    return joint, roles, kwargs["num_fwd_outputs"], build_flow_problem(roles, costs, profile), profile


@pytest.mark.parametrize("name, max_nodes", [("mlp", 60), ("block_sdpa", 60), ("block_sdpa", 25)])
def test_frontier_plans_survive_merging_and_the_milp_is_never_above_them(name, max_nodes):
    joint, roles, num_fwd_outputs, flow, profile = _prepared(name)
    plans = frontier(flow.parametric, 0.0, 1e6 / profile.mem_bandwidth)
    saved_names = [{flow.nodes[v].name for v in plan.saved} for plan in plans]
    keep = set().union(*saved_names)
    schedule = build_schedule_graph(joint, roles, num_fwd_outputs, flow, keep_distinct=keep, max_nodes=max_nodes)
    graph = schedule.graph
    by_name = {n.name: n for n in joint.graph.nodes}
    own_bytes = sum(n.meta["val"].untyped_storage().nbytes() for n in by_name.values() if _owns_storage(n))
    assert sum(graph.nbytes) <= own_bytes  # views allocate nothing
    for name in keep:  # a saved value stays its storage's owner (or its multi-output op), never merged away
        for node in schedule.nodes_of({name}):
            value = by_name[name]
            parent = value.args[0].name if value.target is operator.getitem else None
            assert schedule.names[node] in {name, alias_root(value).name, parent}, (name, schedule.names[node])
    for names in saved_names:
        ours = evaluate_plan(graph, schedule.nodes_of(names))
        if sum(not f for f in graph.free) <= 30:
            best = solve_min_peak(graph, ours.compute_seconds, time_limit=20)
            assert best.peak_bytes <= ours.peak_bytes
    if name == "block_sdpa":
        assert sum(not f for f in graph.free) <= max_nodes + 10, "merging stops only where nothing can merge"


def _owns_storage(node) -> bool:
    val = node.meta.get("val")
    return node.op != "placeholder" and hasattr(val, "untyped_storage") and val._base is None


def test_with_step_peak_the_gradients_are_kept_to_the_steps_end():
    """``step_peak``: exactly the parameter gradients (the backward graph's outputs) are kept; every plan's peak is
    then at least the activation peak plus nothing less than the gradients made before it."""
    joint, roles, num_fwd_outputs, flow, _ = _prepared("mlp")
    activation = build_schedule_graph(joint, roles, num_fwd_outputs, flow).graph
    step = build_schedule_graph(joint, roles, num_fwd_outputs, flow, step_peak=True).graph
    gradients = [i for i in step.required if step.backward[i]]
    assert not activation.kept and gradients
    assert [i for i in range(len(step)) if step.is_kept(i)] == gradients
    assert step.kept_before[-1] == sum(step.nbytes[i] for i in gradients if step.stage_of(i) < step.num_stages)
    for saved in ((), tuple(step.forward_nodes)):
        assert evaluate_plan(step, saved).peak_bytes > evaluate_plan(activation, saved).peak_bytes
