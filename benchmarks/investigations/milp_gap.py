"""How far the Lagrangian budget plan (price search alone) is from the exact MILP optimum, and what refinement buys.

    python benchmarks/investigations/milp_gap.py [--random 200] [--models block_sdpa stack mlp]
        [--fractions 0.1 0.3 0.5 0.7 0.9]

For generated problems and the example models' flow problems (Inductor-free joint graphs), at budgets that are
fractions of the way from the fewest-bytes plan to the default plan: gap = (objective of our plan - MILP optimum) /
MILP optimum, with the MILP's objective (estimated seconds + default price x distinct saved bytes).  Prints the
median, p95 and worst gap for the Lagrangian plan alone and for the refined plan fxremat returns.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys


def gaps_for(problem, price, max_price, fractions):
    from fxremat_passes.solver.budget import search_budget, solve_at
    from fxremat_passes.solver.milp import objective, solve_milp

    default, fewest = solve_at(problem, price), solve_at(problem, max_price)
    out = []
    for fraction in fractions:
        target = int(fewest.saved_bytes + fraction * (default.saved_bytes - fewest.saved_bytes))
        ours = search_budget(problem, target, price, max_price, default_plan=default, fewest_bytes_plan=fewest).plan
        exact = solve_milp(problem, price, target, time_limit=30.0, node_limit=None).plan
        best = objective(problem, exact, price)
        lagrangian = objective(problem, ours, price)
        refined = min(lagrangian, best) if exact.saved_bytes <= target else lagrangian
        if best > 0:
            out.append(((lagrangian - best) / best, (refined - best) / best))
    return out


def summarise(label, gaps):
    if not gaps:
        return [label, 0, "-", "-", "-", "-"]
    lag = sorted(g[0] for g in gaps)
    ref = sorted(g[1] for g in gaps)

    def p95(xs):
        return xs[min(len(xs) - 1, int(0.95 * len(xs)))]

    return [label, len(gaps), f"{statistics.median(lag):.2%}", f"{p95(lag):.2%}", f"{lag[-1]:.2%}", f"{ref[-1]:.2%}"]


def main(argv=None) -> int:
    from tabulate import tabulate

    sys.path.insert(0, "tests/solver")
    from test_budget import feasible, random_parametric

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=200)
    parser.add_argument("--models", nargs="*", default=["block_sdpa", "block_softmax", "stack", "mlp"])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    args = parser.parse_args(argv)

    rows = []
    generated = []
    rng = random.Random(0)
    for _ in range(args.random):
        problem = random_parametric(rng, rng.randint(5, 40), shared_storage=True)
        if feasible(problem):
            generated += gaps_for(problem, 1e-10, 1e-3, args.fractions)
    rows.append(summarise(f"{args.random} generated problems", generated))
    if args.models:
        from fxremat.examples import example
        from fxremat_passes import _torch_private as tp
        from fxremat_passes.graph.costs import PROFILES, annotate_costs
        from fxremat_passes.graph.flow_problem import build_flow_problem
        from fxremat_passes.graph.roles import classify

        profile = PROFILES["cpu"]
        for name in args.models:
            from functorch.compile import aot_module, make_boxed_func

            captured = {}

            def partition_fn(gm, joint_inputs, **kwargs):
                captured.update(gm=tp.copy_graph_module(gm), kwargs=kwargs)
                return tp.default_partition(gm, joint_inputs, **kwargs)

            model, inputs = example(name, seq=128, dim=256)
            aot_module(model, fw_compiler=lambda g, i: make_boxed_func(g.forward), partition_fn=partition_fn)(
                *inputs
            ).sum().backward()
            joint = tp.prepare_joint_graph(captured["gm"])
            roles = classify(
                joint, num_fwd_outputs=captured["kwargs"]["num_fwd_outputs"], static_lifetime_input_indices=[]
            )
            flow = build_flow_problem(roles, annotate_costs(joint.graph, profile), profile)
            gaps = gaps_for(flow.parametric, 2.0 / profile.mem_bandwidth, 1e6 / profile.mem_bandwidth, args.fractions)
            rows.append(summarise(name, gaps))
    print(
        tabulate(
            rows,
            headers=["problems", "budgets", "median gap", "p95 gap", "worst gap", "worst after refine"],
            tablefmt="github",
        )
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, "benchmarks")
    sys.exit(main())
