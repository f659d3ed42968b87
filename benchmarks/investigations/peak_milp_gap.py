"""How far fxremat's plans are from the exact peak MILP (``fxremat_passes.solver.peak_milp``), under the MILP's own
model.

    python benchmarks/investigations/peak_milp_gap.py [--graphs chain_4 ... llama_stack] [--time-limit 120]
        [--json out.json]

For each graph (named generated models and fxremat's examples at batch 2, seq 16, dim 32) and each fxremat setting
(peak_budget 0.0 and 0.5, memory_budget 0.5 and 0.2, the default): the plan fxremat chooses (AOTAutograd with
fxremat's partitioner and no-op compilers: no Inductor), evaluated under the MILP's memory model (peak P_ours,
compute C_ours), then the MILP's least peak P* at compute <= C_ours.  gap = P_ours / P* - 1, summarised (median,
worst) over the rows HiGHS proved optimal.  The joint graph is reduced and merged to at most 60 nodes, never merging
a value some setting saves (``peak_milp_graph.py``); ``nodes`` and ``stages`` are the MILP's.  A plan that
recomputes its forward segment by segment in backward (``passes/rewrite/segments.py``) is not its saved set recomputed
lazily, the only schedule ``peak_milp.plan_schedule`` makes of a plan: its row says "segmented" and is left out of
the summary (session 28: the front-loaded budget plans of the small stack and block_sdpa are such plans).

``--peak step`` (the default since session 29) keeps each gradient to the step's end, as a training step holds
parameter gradients until the optimizer reads them: the step's peak, the one fxremat's planner judges its plans by
(``liveness.simulate_step``) and issue #15 measures.  ``--peak activation`` hands each gradient over after its last
reader (the MILP's model before session 29): chain_8's ``memory_budget=0.5`` plan is 16.7% above that optimum while
it has the lowest simulated step peak of all 56 plans saving three of its eight activations (the work log, session 29).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

SETTINGS = {
    "peak_budget=0.0": dict(peak_budget=0.0),
    "peak_budget=0.5": dict(peak_budget=0.5),
    "memory_budget=0.5": dict(memory_budget=0.5),
    "memory_budget=0.2": dict(memory_budget=0.2),
    "default": {},
}
GENERATED = ("chain_4", "chain_8", "residual_2", "residual_4", "residual_8")
EXAMPLES = ("mlp", "block_sdpa", "stack", "llama_stack")


def build_model(name: str):
    """(model, inputs): ``chain_N``: N x (Linear, tanh); ``residual_N``: N x (x + Linear(gelu(Linear(x)))), width 32;
    otherwise ``fxremat.examples.example(name, batch=2, seq=16, dim=32)``."""
    import torch
    import torch.nn as nn

    from fxremat.examples import example

    torch.manual_seed(0)
    kind, _, depth = name.rpartition("_")
    if kind == "chain":
        return nn.Sequential(*[m for _ in range(int(depth)) for m in (nn.Linear(32, 32), nn.Tanh())]), (
            torch.randn(32, 32),
        )
    if kind == "residual":

        class Residual(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

            def forward(self, x):
                return x + self.down(torch.nn.functional.gelu(self.up(x)))

        return nn.Sequential(*[Residual() for _ in range(int(depth))]), (torch.randn(32, 32),)
    return example(name, batch=2, seq=16, dim=32)


def capture_plans(model, inputs) -> tuple[object, dict, dict[str, tuple[str, ...]], set[str]]:
    """The joint graph (as AOTAutograd hands it over), the partitioner's kwargs, each setting's saved names, and
    the settings whose plan recomputes in segments in backward (``report.backward_checkpoints``)."""
    from functorch.compile import aot_module, make_boxed_func

    import fxremat
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp

    captured: dict = {}
    saved: dict[str, tuple[str, ...]] = {}
    segmented: set[str] = set()
    for setting, options in SETTINGS.items():
        reports: list = []
        ours = fxremat.make_partition_fn(Options.create(strict=True, compare_default=False, **options), reports)

        def partition_fn(gm, joint_inputs, **kwargs):
            captured.setdefault("gm", tp.copy_graph_module(gm))
            captured.setdefault("kwargs", kwargs)
            return ours(gm, joint_inputs, **kwargs)

        def noop(gm, _):
            return make_boxed_func(gm.forward)

        compiled = aot_module(copy.deepcopy(model), fw_compiler=noop, bw_compiler=noop, partition_fn=partition_fn)
        compiled(*inputs).sum().backward()
        (report,) = reports
        saved[setting] = tuple(r.name for r in report.saved)
        if report.backward_checkpoints:
            segmented.add(setting)
    return captured["gm"], captured["kwargs"], saved, segmented


def schedule_of(gm, kwargs, saved: dict[str, tuple[str, ...]], step_peak: bool = True):
    from fxremat_passes.graph.costs import PROFILES, annotate_costs
    from fxremat_passes.graph.cse import prepare_joint_graph
    from fxremat_passes.graph.flow_problem import VALUE_ROLES, build_flow_problem
    from fxremat_passes.graph.roles import classify
    from fxremat_passes.simulator.peak_milp_graph import build_schedule_graph

    joint = prepare_joint_graph(gm)
    roles = classify(
        joint,
        num_fwd_outputs=kwargs["num_fwd_outputs"],
        static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
    )
    profile = PROFILES["cpu"]
    costs = annotate_costs(joint.graph, profile, [n for n, r in roles.role.items() if r in VALUE_ROLES])
    flow = build_flow_problem(roles, costs, profile)
    names = {n.name for n in joint.graph.nodes}
    missing = {s for names_ in saved.values() for s in names_} - names
    if missing:
        raise RuntimeError(f"saved values not in the joint graph: {sorted(missing)}")
    keep = {s for names_ in saved.values() for s in names_}
    return build_schedule_graph(joint, roles, kwargs["num_fwd_outputs"], flow, keep_distinct=keep, step_peak=step_peak)


def rows_for(name: str, time_limit: float, saved_cap: bool = False, step_peak: bool = True) -> list[dict]:
    from fxremat_passes.solver.peak_milp import (
        evaluate_schedule,
        least_peak,
        plan_schedule,
        saved_bytes,
        solve_min_peak,
    )

    gm, kwargs, saved, segmented = capture_plans(*build_model(name))
    schedule = schedule_of(gm, kwargs, saved, step_peak)
    graph = schedule.graph
    solved: dict[float, object] = {}  # settings that chose the same compute share one solve
    rows = []
    for setting, names in saved.items():
        plan = plan_schedule(graph, schedule.nodes_of(names))
        ours = evaluate_schedule(graph, plan)
        key = round(ours.compute_seconds, 15)
        if key not in solved:
            solved[key] = solve_min_peak(graph, ours.compute_seconds, time_limit)
        best = solved[key]
        gap = ours.peak_bytes / best.peak_bytes - 1 if best.schedule is not None and best.peak_bytes else None
        rows.append(
            dict(
                graph=name,
                setting=setting,
                peak="step" if step_peak else "activation",
                nodes=sum(not f for f in graph.free),
                stages=graph.num_stages,
                peak_ours=ours.peak_bytes,
                compute_ours_us=ours.compute_seconds * 1e6,
                peak_milp=best.peak_bytes if best.schedule is not None else None,
                lower_bound=best.lower_bound_bytes,
                floor=least_peak(graph),  # every schedule's peak is at least this: P* here ties every plan there
                gap=gap,
                optimal=best.optimal,
                solve_s=best.solve_seconds,
                saved_ours=saved_bytes(graph, plan),
            )
        )
        if saved_cap and setting.startswith("memory_budget"):
            rows[-1].update(_capped(graph, ours, saved_bytes(graph, plan), time_limit))
        if setting in segmented:  # P_ours is of its saved set run unsegmented: not the plan that runs
            rows[-1].update(segmented=True, gap=None)
            if "gap_capped" in rows[-1]:
                rows[-1]["gap_capped"] = None
    return rows


def _capped(graph, ours, cap: int, time_limit: float) -> dict:
    """The MILP held to the plan's own saved bytes too (a memory_budget plan's constraint)."""
    from fxremat_passes.solver.peak_milp import solve_min_peak

    best = solve_min_peak(graph, ours.compute_seconds, time_limit, max_saved_bytes=cap)
    gap = ours.peak_bytes / best.peak_bytes - 1 if best.schedule is not None and best.peak_bytes else None
    return dict(
        peak_milp_capped=best.peak_bytes if best.schedule else None, gap_capped=gap, optimal_capped=best.optimal
    )


def summary(rows: list[dict], gap: str = "gap", optimal: str = "optimal") -> str:
    gaps = [r[gap] for r in rows if r[optimal] and r[gap] is not None]
    graphs = sorted({r["graph"] for r in rows if r[optimal]})
    left_out = sum(1 for r in rows if r.get("segmented"))
    segmented = f"; {left_out} segmented, left out (the MILP schedules a saved set unsegmented)" if left_out else ""
    if not gaps:
        return "no row proven optimal" + segmented
    milp = "peak_milp_capped" if gap == "gap_capped" else "peak_milp"
    floored = sum(1 for r in rows if r[optimal] and r[gap] is not None and r.get(milp) == r.get("floor"))
    return (
        f"{len(gaps)} of {len(rows)} rows proven optimal ({len(graphs)} graphs: {', '.join(graphs)}); "
        f"gap median {statistics.median(gaps):.2%}, worst {max(gaps):.2%}; "
        f"{floored} of them with the optimum at the floor (a node every schedule runs, with the gradients before it)"
        + segmented
    )


def _percent(gap: float | None, segmented: bool = False) -> str:
    return "segmented" if segmented else "-" if gap is None else f"{gap:.1%}"


def format_table(rows: list[dict], saved_cap: bool) -> str:
    from tabulate import tabulate

    headers = ["graph", "setting", "nodes", "stages", "P_ours B", "C_ours us", "saved B", "P* B", "floor B", "gap"]
    headers += ["optimal?", "solve s"] + (["P*cap B", "gap cap", "optimal cap?"] if saved_cap else [])
    table = []
    for r in rows:
        cells = [r["graph"], r["setting"], r["nodes"], r["stages"], r["peak_ours"], f"{r['compute_ours_us']:.2f}"]
        cells += [r["saved_ours"], r["peak_milp"], r["floor"], _percent(r["gap"], r.get("segmented", False))]
        cells += ["yes" if r["optimal"] else "no", f"{r['solve_s']:.1f}"]
        if saved_cap and "gap_capped" in r:
            capped = _percent(r["gap_capped"], r.get("segmented", False))
            cells += [r["peak_milp_capped"], capped, "yes" if r["optimal_capped"] else "no"]
        table.append(cells)
    return tabulate(table, headers=headers, tablefmt="github")


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=[*GENERATED, *EXAMPLES])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP solve (HiGHS)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--peak",
        choices=("step", "activation"),
        default="step",
        help="step: gradients kept to the step's end (the step's peak); activation: freed after their last reader",
    )
    parser.add_argument(
        "--saved-cap",
        action="store_true",
        help="memory_budget rows: also solve with the plan's saved bytes as a cap (columns P*cap, gap cap)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.graphs:
        start = time.perf_counter()
        rows += rows_for(name, args.time_limit, args.saved_cap, args.peak == "step")
        print(f"{name}: {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
    print(format_table(rows, args.saved_cap))
    print()
    print(summary(rows))
    if args.saved_cap:
        capped = [r for r in rows if "gap_capped" in r]
        print("saved-bytes cap, memory_budget rows: " + summary(capped, "gap_capped", "optimal_capped"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
