"""Partition (solve) time on N stacked transformer blocks: fxremat vs PyTorch's partitioner on the same joint graphs.

    python benchmarks/solve_time.py [--blocks 1 4 16 48 96] [--sweep 20] [--repeats 3] [--markdown PATH]
                                    [--only COLUMN ...]

For each N: trace the joint graph once (AOTAutograd, no Inductor), then time, interleaved, on fresh copies of it
(the copy is made before the clock starts, on both sides):
  - PyTorch's ``min_cut_rematerialization_partition`` (default, and with ``activation_memory_budget=0.5``);
  - fxremat's whole partition (default plan, ``compare_default=False``: saved-set choice, split, report but for
    its simulated peak, see ``report_read``) and with ``memory_budget=0.5``;
  - both defaults again inside ``lazy_graph_modules()``, the setting Inductor's ``compile_fx`` partitions in (the
    returned GraphModules generate their Python code on first use, after the partition);
  - ``codegen``: generating and compiling the Python code of fxremat's forward and backward GraphModules alone
    (what an eager-GraphModule partition cannot avoid);
  - ``report_read``: what fxremat's partition leaves for later, timed apart: the report's simulated-peak fields
    (the step's liveness simulation, on the report's own copy of the split), computed on their first read;
  - ``stored_lazy``: what a compile with fxremat's defaults pays for its partition (issue 16): the whole partition
    with ``Options.create()``'s defaults (``compare_default`` off unless ``FXREMAT_COMPARE``/``FXREMAT_REPORT_DIR``
    say otherwise) inside ``lazy_graph_modules()``, plus the report's JSON as ``fxremat.backend`` stores it for the
    compile cache (``backend.stored_report_json``: no deferred field computed unless asked for);
    ``compare_stored_lazy``: the same with ``compare_default=True`` (the default before issue 16: PyTorch's
    partition on a copy, the frontier, and both splits simulated for the stored report);
  - a sweep of ``--sweep`` budgets from 1.0 to 0.0 over one flow problem (what a frontier costs), with the
    searches sharing one ``SolveCache`` and (``_unshared``) each bisecting from scratch;
  - the max-flow alone on fxremat's flow problem: scipy's Dinic (ours) vs networkx's ``minimum_cut``.
Times are medians of ``--repeats`` runs (seconds, wall clock; ``--cpu``: the process's CPU seconds, for a shared
machine), on one thread; the machine's load shows in the spread, which goes to stderr.  ``--only`` times those
columns alone (e.g. ``pytorch_default_lazy_s fxremat_stored_lazy_s``), without the sweep and the max-flow
comparison: less CPU on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time

import torch


def capture(blocks: int, dim: int = 64, batch: int = 2, seq: int = 16) -> dict:
    """The joint graph of ``Stack(blocks, dim)`` on a batch x seq x dim input (aot_module, no Inductor): gm, the
    joint inputs and the partitioner's kwargs."""
    from functorch.compile import aot_module, make_boxed_func

    from fxremat.examples import Stack

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured.update(gm=copy.deepcopy(gm), inputs=joint_inputs, kwargs=kwargs)
        from torch._functorch.partitioners import default_partition

        return default_partition(gm, joint_inputs, **kwargs)

    torch.manual_seed(0)
    model = Stack(blocks, dim=dim)
    compiled = aot_module(model, fw_compiler=lambda g, i: make_boxed_func(g.forward), partition_fn=partition_fn)
    compiled(torch.randn(batch, seq, dim)).sum().backward()
    return captured


def _maybe(lazy: bool):
    from fxremat_passes import _torch_private as tp

    return tp.lazy_graph_modules() if lazy else contextlib.nullcontext()


# what ``timed`` reads: wall seconds, or with ``--cpu`` the process's CPU seconds (every thread's: HiGHS's too), which
# another job on a shared machine does not inflate as much
CLOCK = {"clock": time.perf_counter}


def timed(fn) -> float:
    clock = CLOCK["clock"]
    start = clock()
    fn()
    return clock() - start


def networkx_seconds(problem) -> float:
    import networkx as nx

    clock = CLOCK["clock"]
    start = clock()
    g = nx.DiGraph()
    for v in range(problem.num_values):
        s, r = problem.save_cost[v], problem.recompute_cost[v]
        g.add_edge(("i", v), ("o", v), capacity=float("inf") if s is None else s)
        if r is None or r > 0:
            g.add_edge("s", ("i", v), capacity=float("inf") if r is None else r)
    for u, w in problem.edges:
        g.add_edge(("o", u), ("i", w), capacity=float("inf"))
    for v in problem.needed:
        g.add_edge(("o", v), "t", capacity=float("inf"))
    nx.minimum_cut(g, "s", "t")
    return clock() - start


def measure(blocks: int, sweep: int, repeats: int = 1, only: list[str] | None = None) -> dict:
    import fxremat
    from fxremat.options import Options
    from fxremat.report import DEFERRED_FIELDS
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.graph.costs import PROFILES, annotate_costs
    from fxremat_passes.graph.flow_problem import build_flow_problem
    from fxremat_passes.graph.roles import classify
    from fxremat_passes.solver.budget import SolveCache, search_budget, solve_at
    from fxremat_passes.solver.mincut import solve_min_cut

    cap = capture(blocks)
    gm, inputs, kwargs = cap["gm"], cap["inputs"], cap["kwargs"]
    row = {"blocks": blocks, "joint_nodes": len(gm.graph.nodes)}

    def pytorch(budget: float = 1.0, lazy: bool = False) -> float:
        joint = tp.copy_graph_module(gm)
        with torch._functorch.config.patch(activation_memory_budget=budget), _maybe(lazy):
            return timed(lambda: tp.min_cut_rematerialization_partition(joint, inputs, **kwargs))

    def ours(lazy: bool = False, **options) -> float:
        joint = tp.copy_graph_module(gm)
        partition_fn = fxremat.make_partition_fn(Options.create(compare_default=False, strict=True, **options), [])
        with _maybe(lazy):
            return timed(lambda: partition_fn(joint, inputs, **kwargs))

    def report_read() -> float:
        reports: list = []
        partition_fn = fxremat.make_partition_fn(Options.create(compare_default=False, strict=True), reports)
        with _maybe(True):
            partition_fn(tp.copy_graph_module(gm), inputs, **kwargs)
        return timed(lambda: [getattr(reports[0], name) for name in DEFERRED_FIELDS])

    def stored(**options) -> float:
        # the partition and the report store's JSON, timed together: what fxremat.backend spends on a joint graph
        from fxremat.backend import stored_report_json

        chosen = Options.create(strict=True, **options)
        reports: list = []
        partition_fn = fxremat.make_partition_fn(chosen, reports)
        joint = tp.copy_graph_module(gm)
        with _maybe(True):
            return timed(lambda: (partition_fn(joint, inputs, **kwargs), stored_report_json(reports[0], chosen)))

    def codegen() -> float:
        fw, bw = fxremat.make_partition_fn(Options.create(compare_default=False, strict=True), [])(
            tp.copy_graph_module(gm), inputs, **kwargs
        )
        return timed(lambda: (fw.recompile(), bw.recompile()))

    runs = {
        "pytorch_default_s": pytorch,
        "fxremat_default_s": ours,
        "pytorch_budget_0.5_s": lambda: pytorch(0.5),
        "fxremat_budget_0.5_s": lambda: ours(memory_budget=0.5),
        "pytorch_default_lazy_s": lambda: pytorch(lazy=True),
        "fxremat_default_lazy_s": lambda: ours(lazy=True),
        "fxremat_report_read_s": report_read,
        "fxremat_stored_lazy_s": stored,
        "fxremat_compare_stored_lazy_s": lambda: stored(compare_default=True),
        "codegen_fw_bw_s": codegen,
    }
    if only:
        unknown = sorted(set(only) - set(runs))
        if unknown:
            raise SystemExit(f"--only: unknown column(s) {unknown}; one of {sorted(runs)}")
        runs = {name: run for name, run in runs.items() if name in only}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():  # interleaved: load changes hit every column alike
            times[name].append(run())
    for name, values in times.items():
        row[name] = statistics.median(values)
    for name, theirs, ours_ in (
        ("speedup_default", "pytorch_default_s", "fxremat_default_s"),
        ("speedup_budget_0.5", "pytorch_budget_0.5_s", "fxremat_budget_0.5_s"),
        ("speedup_default_lazy", "pytorch_default_lazy_s", "fxremat_default_lazy_s"),
        ("speedup_stored_lazy", "pytorch_default_lazy_s", "fxremat_stored_lazy_s"),
        ("speedup_compare_stored_lazy", "pytorch_default_lazy_s", "fxremat_compare_stored_lazy_s"),
    ):
        if theirs in row and ours_ in row:
            row[name] = row[theirs] / row[ours_]
    print(f"{blocks} blocks, all runs: {times}", file=sys.stderr, flush=True)
    if only:
        return row

    joint = tp.prepare_joint_graph(tp.copy_graph_module(gm))
    roles = classify(joint, num_fwd_outputs=kwargs["num_fwd_outputs"], static_lifetime_input_indices=[])
    profile = PROFILES["cpu"]
    flow = build_flow_problem(roles, annotate_costs(joint.graph, profile), profile)
    problem = flow.parametric
    price, max_price = 2.0 / profile.mem_bandwidth, 1e6 / profile.mem_bandwidth
    row["flow_values"] = problem.num_values

    def budget_sweep(shared: bool):
        # shared: one SolveCache for the whole sweep (what fxremat does when it searches several budgets of one
        # graph); not shared: each budget bisects from scratch
        cache = SolveCache(problem) if shared else None
        default, fewest = solve_at(problem, price), solve_at(problem, max_price)
        for i in range(sweep):
            fraction = 1.0 - i / max(1, sweep - 1)
            target = int(fewest.saved_bytes + fraction * (default.saved_bytes - fewest.saved_bytes))
            search_budget(
                problem, target, price, max_price, default_plan=default, fewest_bytes_plan=fewest, cache=cache
            )

    row[f"fxremat_sweep_{sweep}_s"] = timed(lambda: budget_sweep(shared=True))
    row[f"fxremat_sweep_{sweep}_unshared_s"] = timed(lambda: budget_sweep(shared=False))
    cut, _ = problem.at(price)
    row["maxflow_scipy_s"] = statistics.median(timed(lambda: solve_min_cut(cut)) for _ in range(3))
    row["maxflow_networkx_s"] = networkx_seconds(cut)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16, 48])
    parser.add_argument("--sweep", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--only", nargs="+", default=None, metavar="COLUMN", help="time these columns alone")
    parser.add_argument("--cpu", action="store_true", help="CPU seconds of this process, not wall seconds")
    args = parser.parse_args(argv)
    if args.cpu:
        CLOCK["clock"] = time.process_time
    torch.set_num_threads(1)
    from tabulate import tabulate

    measure(1, 2, only=args.only)  # warm-up: first calls import Inductor's pattern matcher (~1 s) on either side
    rows = []
    for blocks in args.blocks:
        rows.append(measure(blocks, args.sweep, args.repeats, args.only))
        print(rows[-1], file=sys.stderr, flush=True)
    headers = list(rows[0])
    table = tabulate(
        [[r[h] if not isinstance(r[h], float) else f"{r[h]:.3f}" for h in headers] for r in rows],
        headers=headers,
        tablefmt="github",
    )
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
