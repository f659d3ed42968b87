"""Offload under a peak budget at GPU shapes (docs/DESIGN.md §16; issue #58's CPU criterion).

    python benchmarks/offload_plan.py [--models gpt2 llama] [--budget 0.5] [--small] [--json OUT]

For each model of ``gpu_shaped.py`` (bf16, cuda metadata, the ``h100`` profile), partitions the step at
``peak_budget=BUDGET`` (a fraction: 0.5 is halfway between the lowest recompute-only simulated peak and the
default's) twice: recompute-only (``offload=False``) and with ``offload="plan"``.  Printed per model: each plan's
estimated step (``est_step_seconds`` plus the offloads' exposed seconds), its simulated step peak (with the offloads
on the host where it has them), the budget's bytes and whether it is met, and the offloaded storages.  The figures
are the cost model's and the simulator's: nothing runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_shaped  # noqa: E402


def plan_row(name: str, offload, budget: float, small: bool) -> dict:
    options = dict(peak_budget=budget, **({"offload": offload} if offload else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports, seconds = gpu_shaped.partition(name, "fxremat", options, small=small)
    report = reports[0]
    exposed = report.offload_exposed_seconds or 0.0
    peak = report.offload_peak_bytes if report.offloaded else report.simulated_peak_bytes
    return dict(
        model=name,
        offload=offload,
        peak_budget=budget,
        peak_budget_bytes=report.peak_budget_bytes,
        est_step_seconds=report.est_step_seconds + exposed,
        exposed_seconds=exposed,
        simulated_peak_bytes=peak,
        met=peak <= report.peak_budget_bytes,
        offloaded=[list(row) for row in report.offloaded],
        fallback=report.fallback_reason,
        partition_seconds=seconds,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(gpu_shaped.MODELS))
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        recompute = plan_row(name, False, args.budget, args.small)
        offload = plan_row(name, "plan", args.budget, args.small)
        rows += [recompute, offload]
        gain = 1 - offload["est_step_seconds"] / recompute["est_step_seconds"]
        for r in (recompute, offload):
            print(
                f"{name:6} offload={r['offload']!s:5} est step {r['est_step_seconds'] * 1e3:8.3f} ms "
                f"(exposed {r['exposed_seconds'] * 1e3:.3f} ms)  peak {r['simulated_peak_bytes'] / 2**20:8.1f} MiB "
                f"budget {r['peak_budget_bytes'] / 2**20:8.1f} MiB met={r['met']}  offloaded {len(r['offloaded'])} "
                f"({sum(o[1] for o in r['offloaded']) / 2**20:.1f} MiB)  partition {r['partition_seconds']:.1f} s"
            )
        print(f"{name:6} offload's estimated step {abs(gain):.1%} {'below' if gain >= 0 else 'above'} recompute-only's")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
