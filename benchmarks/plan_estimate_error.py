"""The plan-level memory estimate (``plan_memory.estimate_peak``) against ``liveness.simulate_step`` of the real
split, on every candidate plan a peak-aware choice ranks (``passes/choice/plan.py``'s ``peak_candidates``, as
``passes/choice/judged.py`` gets them).

    python benchmarks/plan_estimate_error.py [--models llama_stack stack mlp block_sdpa] [--batch 2 --seq 128 --dim 192]

Prints, per model, the candidates' count, the max and median relative error of the step peak and of the activation
peak, and the median milliseconds of one estimate and of one split + simulation.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def capture(model, inputs):
    from functorch.compile import aot_module, make_boxed_func

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured.update(gm=copy.deepcopy(gm), kwargs=kwargs)
        from torch._functorch.partitioners import default_partition

        return default_partition(gm, joint_inputs, **kwargs)

    compiled = aot_module(model, fw_compiler=lambda g, i: make_boxed_func(g.forward), partition_fn=partition_fn)
    compiled(*inputs).sum().backward()
    return captured["gm"], captured["kwargs"]


def setup(gm, kwargs):
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.choice.plan import peak_candidates
    from fxremat_passes.graph.costs import PROFILES, annotate_costs
    from fxremat_passes.graph.flow_problem import build_flow_problem
    from fxremat_passes.graph.roles import Role, classify
    from fxremat_passes.solver.budget import SolveCache

    num_fwd_outputs = kwargs["num_fwd_outputs"]
    joint = tp.prepare_joint_graph(gm)
    roles = classify(joint, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=None)
    profile = PROFILES["cpu"]
    flow = build_flow_problem(roles, annotate_costs(joint.graph, profile), profile)
    forward = [roles.role[n] is Role.FORWARD for n in flow.nodes]
    options = Options.create()
    candidates = peak_candidates(flow.parametric, forward, options, profile, None, SolveCache(flow.parametric)).every()
    return joint, roles, flow, candidates, num_fwd_outputs


def measure(name: str, batch: int, seq: int, dim: int) -> dict:
    from fxremat.examples import example
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.rewrite.split import split_with_recipe
    from fxremat_passes.simulator.liveness import simulate_step
    from fxremat_passes.simulator.plan_memory import build_joint_memory, estimate_peak

    torch.manual_seed(0)
    model, inputs = example(name, batch=batch, seq=seq, dim=dim)
    joint, roles, flow, candidates, num_fwd_outputs = setup(*capture(model, inputs))
    start = time.perf_counter()
    memory = build_joint_memory(joint, roles, num_fwd_outputs)
    build_s = time.perf_counter() - start
    index = {n: i for i, n in enumerate(joint.graph.nodes)}
    step, act, est_ms, sim_ms = [], [], [], []
    for plan in candidates:
        saved = [flow.nodes[v] for v in plan.saved]
        start = time.perf_counter()
        estimated = estimate_peak(memory, {index[n] for n in saved})
        est_ms.append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        fw, bw, _ = split_with_recipe(
            joint,
            [n for n in saved if not tp.is_sym_node(n)],
            [n for n in saved if tp.is_sym_node(n)],
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=roles.static_inputs,
        )
        simulated = simulate_step(fw, bw, num_fwd_outputs)
        sim_ms.append(1e3 * (time.perf_counter() - start))
        step.append(abs(estimated.peak_bytes - simulated.peak_bytes) / simulated.peak_bytes)
        act.append(
            abs(estimated.activation_peak_bytes - simulated.activation_peak_bytes)
            / max(1, simulated.activation_peak_bytes)
        )
    return dict(
        model=name,
        candidates=len(candidates),
        step_max=max(step),
        step_median=statistics.median(step),
        act_max=max(act),
        act_median=statistics.median(act),
        build_ms=1e3 * build_s,
        estimate_ms=statistics.median(est_ms),
        simulate_ms=statistics.median(sim_ms),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["llama_stack", "stack", "mlp", "block_sdpa"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("model        plans  step max  step med   act max   act med  build ms  est ms  split+sim ms")
    for name in args.models:
        r = measure(name, args.batch, args.seq, args.dim)
        print(
            f"{r['model']:<12} {r['candidates']:>5} {r['step_max']:>8.2%} {r['step_median']:>9.2%} "
            f"{r['act_max']:>8.2%} {r['act_median']:>8.2%} {r['build_ms']:>9.1f} {r['estimate_ms']:>7.1f} "
            f"{r['simulate_ms']:>12.1f}"
        )


if __name__ == "__main__":
    main()
