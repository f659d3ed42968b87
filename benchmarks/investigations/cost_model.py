"""Check the cost model against this machine: time every distinct op of the example models' joint graphs alone
(one thread, median of repeats) and compare with fxremat's ``est_seconds`` for it.

    python benchmarks/investigations/cost_model.py [--models mlp block_sdpa ...] [--dim 256] [--repeats 20]
        [--device-profile cpu]

Prints the Spearman rank correlation between estimated and measured seconds, the median ratio (how far the fixed
CPU constants are from this machine), and the worst outliers in rank.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch


def capture(name: str, dim: int):
    from functorch.compile import aot_module, make_boxed_func
    from torch._functorch.partitioners import default_partition

    from fxremat.examples import example

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured["gm"] = copy.deepcopy(gm)
        return default_partition(gm, joint_inputs, **kwargs)

    model, inputs = example(name, dim=dim, seq=128 if dim >= 128 else 32)
    compiled = aot_module(model, fw_compiler=lambda g, i: make_boxed_func(g.forward), partition_fn=partition_fn)
    compiled(*inputs).sum().backward()
    return captured["gm"]


def materialise(arg):
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.dtype.is_floating_point:
                return torch.randn(val.shape, dtype=val.dtype)
            if val.dtype == torch.bool:
                return torch.ones(val.shape, dtype=torch.bool)
            return torch.zeros(val.shape, dtype=val.dtype)
        return val
    if isinstance(arg, (list, tuple)):
        return type(arg)(materialise(a) for a in arg)
    return arg


def time_node(node, repeats: int) -> float | None:
    args = materialise(node.args)
    kwargs = {k: materialise(v) for k, v in node.kwargs.items()}
    try:
        node.target(*args, **kwargs)
    except Exception:
        return None
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        node.target(*args, **kwargs)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv=None) -> int:
    from scipy.stats import spearmanr
    from tabulate import tabulate

    from fxremat_passes.graph.costs import PROFILES, annotate_costs
    from fxremat_passes.graph.ops import NEVER_RECOMPUTE, OpClass, qualified_name

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block_sdpa", "block_softmax", "convnet"])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device-profile", default="cpu")
    parser.add_argument("--outliers", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    profile = PROFILES[args.device_profile]

    rows = {}
    for name in args.models:
        gm = capture(name, args.dim)
        costs = annotate_costs(gm.graph, profile)
        for node, cost in costs.items():
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            if cost.op_class in NEVER_RECOMPUTE or cost.op_class in (OpClass.VIEW, OpClass.GETITEM):
                continue
            shapes = tuple(
                tuple(a.meta["val"].shape) for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)
            )
            key = (str(node.target), shapes)
            if key in rows:
                continue
            measured = time_node(node, args.repeats)
            if measured is None:
                continue
            rows[key] = (qualified_name(node), cost.op_class.value, shapes, cost.est_seconds, measured)
    estimated = [r[3] for r in rows.values()]
    measured = [r[4] for r in rows.values()]
    rho = spearmanr(estimated, measured).statistic
    ratio = statistics.median(m / e for e, m in zip(estimated, measured) if e > 0)
    print(f"{len(rows)} distinct ops from {', '.join(args.models)} (dim {args.dim}), profile {profile.name}, 1 thread")
    print(f"Spearman rank correlation (estimated vs measured seconds): {rho:.3f}")
    print(f"median measured/estimated: {ratio:.2f}x")
    ranks_e = {k: i for i, k in enumerate(sorted(rows, key=lambda k: rows[k][3]))}
    ranks_m = {k: i for i, k in enumerate(sorted(rows, key=lambda k: rows[k][4]))}
    worst = sorted(rows, key=lambda k: -abs(ranks_e[k] - ranks_m[k]))[: args.outliers]
    table = [
        [
            rows[k][0],
            rows[k][1],
            "; ".join("x".join(map(str, s)) for s in rows[k][2])[:40],
            f"{rows[k][3] * 1e6:.1f}",
            f"{rows[k][4] * 1e6:.1f}",
            ranks_e[k] - ranks_m[k],
        ]
        for k in worst
    ]
    print(tabulate(table, headers=["op", "class", "input shapes", "est us", "measured us", "rank diff"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
