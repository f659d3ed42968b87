"""What moving the backward's recomputation earlier does to C++ units and to the measured peak (issue #16's lead).

    python benchmarks/hoisted_recompute.py MODEL [--setting default] [--stretches 0 3]

A diagnostic, not a product path.  For each ``--stretches`` k, in a fresh process with an empty Inductor cache, the
model's step is compiled with fxremat under real Inductor (``setting_peak.row``: gradients against eager, the
profiler's step peak, fxremat's simulated peak) with the backward's order replaced: every node that computes from
the backward's inputs alone (a recompute: generated-kernel classes and views, never an extern kernel, a write or a
draw) moved before the stretch of extern kernels ahead of it, never past a write, k times over (k = 0: fxremat's
own order, as shipped).  The backward's C++ units are counted in the generated code.  ``--no-inductor-reorder``:
with Inductor's ``reorder_for_peak_memory`` off (its default is on), which is what makes the moved order pay on
ViT.  The simulation is bypassed (every order is taken), so the printed ``simulated`` is the simulator's estimate
of that order, beside the measured peak: session 31 found the simulator far above the measured peak on such
orders (benchmarks/RESULTS.md, "Session 31"); since session 32 it replays Inductor's reordering
(``fxremat_passes/simulator/peak_order.py``) and was within bytes of ViT's at one and three stretches, but not at two
(simulated 8,029,960 B, measured 8,523,536: RESULTS.md, "Session 32"); since session 33 the simulated fusion follows
Inductor's C++ loop sizes and the moved orders simulate 3-4% off either way (RESULTS.md, "Session 33").
``$HOISTED_CACHE_DIR``: the Inductor cache folder to use (and keep, to read the generated code); default a new one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROW_MARKER = "HOISTED_ROW "


def _is_extern(node, phase, hoistable) -> bool:
    return node.op == "call_function" and phase.classes.get(node) not in hoistable


def one_stretch_earlier(order: list, phase) -> list:
    """``order`` with each recompute moved before the stretch of externs (and free nodes between them) ahead of it,
    never above one of its inputs."""
    from fxremat_passes.graph.costs import NO_KERNEL as free  # views, items, SymInt arithmetic (and in/outputs)
    from fxremat_passes.simulator import kernel_runs
    from fxremat_passes.simulator.lowering import KERNEL_CLASSES

    hoistable = KERNEL_CLASSES | free
    ready, order = {n for n in order if n.op == "placeholder"}, list(order)
    for node in list(order):
        if node in ready or node.op != "call_function" or phase.classes.get(node) not in hoistable:
            continue
        if kernel_runs._writes(node) or kernel_runs._draws(node) or not set(node.all_input_nodes) <= ready:
            continue
        ready.add(node)
        at = order.index(node)
        q = at - 1
        while q >= 0 and not _is_extern(order[q], phase, hoistable):
            q -= 1
        while q > 0 and order[q - 1] not in ready:
            before = order[q - 1]
            if not (_is_extern(before, phase, hoistable) or phase.classes.get(before) in free):
                break
            q -= 1
        if q < 0 or q <= max((order.index(a) for a in node.all_input_nodes), default=-1):
            continue
        if any(kernel_runs._writes(passed) for passed in order[q:at]):
            continue  # a read moved past a write would see another value
        order.insert(q, order.pop(at))
    return order


def worker(model: str, setting: str, stretches: int, reorder: bool = True) -> dict:
    """One compile and step in this process, the backward's order replaced (module docstring)."""
    cache = os.environ.get("HOISTED_CACHE_DIR") or tempfile.mkdtemp()  # kept: its generated code can be read
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    sys.path.insert(0, str(HERE))
    import torch
    import torch._inductor.config

    torch.set_num_threads(1)
    torch._inductor.config.reorder_for_peak_memory = reorder  # Inductor's default: True
    from fxremat_passes.rewrite import cpp_units
    from fxremat_passes.simulator import liveness

    if stretches:

        def orders(view, phase):
            order = list(view.nodes)
            for _ in range(stretches):
                order = one_stretch_earlier(order, phase)
            return [order]

        plain = cpp_units.joined_step

        def forced_step(fw, bw, num_fwd_outputs):
            """The built backward only (the plans are chosen as shipped): the order above, whatever it simulates."""
            kept = liveness.joined_orders, liveness._better
            liveness.joined_orders, liveness._better = orders, lambda joined, own: True
            try:
                return plain(fw, bw, num_fwd_outputs)
            finally:
                liveness.joined_orders, liveness._better = kept

        cpp_units.joined_step = forced_step
    import setting_peak

    row = setting_peak.row(model, setting)
    units = sorted(
        len(re.findall(r"^cpp_fused\w* = async_compile", Path(f).read_text(), re.M))
        for f in glob.glob(cache + "/**/*.py", recursive=True)
    )
    keep = ("measured", "simulated", "saved", "grad")
    found = dict(model=model, setting=setting, stretches=stretches, reorder_for_peak_memory=reorder)
    found["units_per_graph"] = units
    return dict(found, **{k: row[k] for k in keep})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--setting", default="default", help="setting_peak.py's names: default, mb0.5, pb0.0, ...")
    parser.add_argument("--stretches", type=int, nargs="+", default=[0, 3])
    parser.add_argument("--no-inductor-reorder", action="store_true", help="reorder_for_peak_memory=False")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        row = worker(args.model, args.setting, args.worker, not args.no_inductor_reorder)
        print(ROW_MARKER + json.dumps(row), flush=True)
        return 0
    for k in args.stretches:
        command = [sys.executable, __file__, args.model, "--setting", args.setting, "--worker", str(k)]
        command += ["--no-inductor-reorder"] if args.no_inductor_reorder else []
        out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
        rows = [line[len(ROW_MARKER) :] for line in out.splitlines() if line.startswith(ROW_MARKER)]
        print(rows[0] if rows else json.dumps(dict(model=args.model, stretches=k, error="no row")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
