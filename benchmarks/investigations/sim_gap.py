"""Simulated vs measured step peak of every plan the planner can choose (issue #15), one model at a time.

    python benchmarks/investigations/sim_gap.py llama_stack [--settings default mb0.5 mb0.2 mb0.0 pb0.5 pb0.0]
                                 [--batch 2 --seq 128 --dim 192] [--hf-size tiny] [--explain]

For each setting: compile with ``fxremat.backend(<setting>, compare_default=False)``, check the gradients against
eager, warm up twice, measure one step's peak (CPU profiler memory events, ``fxremat.measure``) and print it beside
the report's ``simulated_peak_bytes``.  ``--explain`` also prints, per graph, the profiler's running total at each
line of Inductor's output code (the line's kernel call, ``empty_strided``, ``del``) next to the simulated timeline
around its peak, and the output code's path.  Settings: ``default``, ``mbX`` (``memory_budget=X``), ``pbX``
(``peak_budget=X``).  MODEL: an example (``fxremat.examples``, the dropout example too), a ``bench_models`` model
(at ``--hf-size``) or a ``conv_models`` net.  Set ``TORCHINDUCTOR_CACHE_DIR`` per experiment: a re-run then skips
Inductor's C++ compile (the AOTAutograd cache is off and our source hash fixed here, so the partitioner, and so the
simulator, runs each time).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and measures


def _options(setting: str) -> dict:
    if setting == "default":
        return {}
    name = {"mb": "memory_budget", "pb": "peak_budget"}[setting[:2]]
    return {name: float(setting[2:])}


def _workload(args):
    import bench_models
    import conv_models

    if args.model in conv_models.CONV_MODELS:
        return conv_models.build_conv_workload(args.model)
    from fxremat.examples import EXAMPLES, example

    if args.model in EXAMPLES:
        torch.manual_seed(0)
        model, inputs = example(args.model, batch=args.batch, seq=args.seq, dim=args.dim)
        return bench_models.Workload(model, args=tuple(inputs))
    return bench_models.build_workload(args.model, args.hf_size)


class _LineClock:
    """Marks each executed line of Inductor's output code (``call``) as a profiler range, so that the profiler's
    memory events can be put against the line that made them."""

    def __init__(self, files: set[str]) -> None:
        self.files = files
        self.open = None
        self.lines: dict[str, tuple[str, int]] = {}  # range name -> (file, line)

    def _close(self) -> None:
        if self.open is not None:
            torch.ops.profiler._record_function_exit._RecordFunction(self.open)
            self.open = None

    def trace(self, frame, event, arg):
        if frame.f_code.co_filename not in self.files or frame.f_code.co_name != "call":
            return None

        def local(frame, event, arg):
            self._close()
            if event == "line":
                name = f"L{len(self.lines)}"
                self.lines[name] = (frame.f_code.co_filename, frame.f_lineno)
                self.open = torch.ops.profiler._record_function_enter_new(name, None)
            return local

        return local


def _measured_lines(step, files: set[str]):
    """(running total after each output-code line, that line's text), from one profiled step."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    from fxremat.measure import cpu_memory_events

    clock = _LineClock(files)
    gc.collect()
    gc.disable()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sys.settrace(clock.trace)
        try:
            step()
        finally:
            sys.settrace(None)
            clock._close()
    gc.enable()
    ranges = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
        for e in prof.profiler.kineto_results.events()
        if e.name() in clock.lines
    ]
    ranges.sort()
    events = sorted(cpu_memory_events(prof))
    rows, total, i = [], 0, 0
    text = {f: Path(f).read_text().splitlines() for f in files}
    for start, end, name in ranges:
        while i < len(events) and events[i][0] < start:
            total += events[i][1]
            i += 1
        during = total
        while i < len(events) and events[i][0] <= end:
            total += events[i][1]
            during = max(during, total)
            i += 1
        f, line = clock.lines[name]
        rows.append((during, Path(f).name, text[f][line - 1].strip()))
    return rows


def _explain(captured, step, code_files, layout: str | None = None) -> None:
    """``layout``: the report's ``inductor_layout`` (the simulation runs under the layout the compile used; without
    one, under Inductor's defaults: channels-last on the CPU)."""
    from fxremat_passes.simulator import liveness
    from fxremat_passes.simulator.backends import device_type_of_graph
    from fxremat_passes.simulator.inputs import SimulatorInputs

    fw, bw, n = captured[-1]
    inputs = SimulatorInputs.default(device_type_of_graph(fw))
    if layout is not None:
        inputs = inputs.with_changes(layout_optimisation=layout == "channels_last")
    phases = []
    run = liveness._Phase.run

    def recording(self, phase, timeline, order=None):
        phases.append((phase, self))
        return run(self, phase, timeline, order)

    liveness._Phase.run = recording
    try:
        sim = liveness.simulate_step(fw, bw, n, inputs=inputs)
    finally:
        liveness._Phase.run = run
    print("  simulated kernels, in order (units fused into one kernel share a line):")
    for phase, p in phases:
        for head in p.fusion_order():
            print(f"    {phase[:2]} {' '.join(u.name for u in p.kernels[head])}")
    print(f"  output code: {' '.join(sorted(code_files))}")
    print(f"  simulated peak {sim.peak_bytes:,} at {sim.peak_phase}:{sim.peak_node}")
    print("  simulated timeline (phase, unit, bytes):")
    for phase, node, nbytes in sim.timeline:
        mark = " <== peak" if (phase, node) == (sim.peak_phase, sim.peak_node) else ""
        print(f"    {phase[:2]} {node:40s} {nbytes:>12,}{mark}")
    print("  measured, per output-code line (bytes held during the line):")
    rows = _measured_lines(step, code_files)
    top = max(r[0] for r in rows)
    for during, fname, line in rows:
        mark = " <== peak" if during == top else ""
        print(f"    {fname[:8]} {during:>12,} {line[:110]}{mark}")


def _backend_module():
    import fxremat  # noqa: F401  (``fxremat.backend`` is also the function of that name)

    return sys.modules["fxremat.backend"]


def run_setting(args, setting: str) -> dict:
    import grad_rule

    import fxremat
    from fxremat.measure import step_peak_bytes

    fb = _backend_module()
    torch._dynamo.reset()
    work = _workload(args)
    reference = copy.deepcopy(work.model)
    work.loss(work.forward(reference)).backward()
    expected = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    captured = []
    pm = importlib.import_module("fxremat.partition")
    original = pm.partition  # the backend imports it at each call (``FxrematPartitioner.__call__``)

    def capturing(request, options):
        fw, bw, report = original(request, options)
        # copies: Inductor rewrites the graphs it gets; with the module's ``meta``, which a copy drops and which
        # marks a segmented backward (``phase_graph.SEGMENTED_BACKWARD_KEY``: its fusion differs)
        copies = [fb.tp.copy_graph_module(g) for g in (fw, bw)]
        for copy_, g in zip(copies, (fw, bw)):
            copy_.meta.update(g.meta)
        captured.append((*copies, request.num_fwd_outputs))
        return fw, bw, report

    pm.partition = capturing
    from torch._inductor.codecache import PyCodeCache

    before = set(PyCodeCache.modules) if hasattr(PyCodeCache, "modules") else set()
    start = time.perf_counter()
    backend = fxremat.backend(compare_default=False, **_options(setting))
    compiled = torch.compile(work.model, backend=backend)

    def step():
        work.loss(work.forward(compiled)).backward()

    try:
        work.model.zero_grad(set_to_none=True)
        step()
    finally:
        pm.partition = original
    # against eager fp32; a gradient that is zero in exact arithmetic (an attention key bias) on the model's scale
    grads = {k: p.grad for k, p in work.model.named_parameters() if k in expected}
    worst = max(grad_rule.relative_errors(grads, expected)[0].values())
    step()
    work.model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(step, "cpu")
    compile_s = time.perf_counter() - start
    report = backend.reports[0] if len(backend.reports) == 1 else None
    sim = report.simulated_peak_bytes if report is not None else None
    row = dict(setting=setting, measured=peak, simulated=sim, saved=report.saved_bytes if report else None)
    row["error"] = (sim - peak) / peak if sim else float("nan")
    row["grad_err"] = worst
    print(
        f"{args.model} {setting}: measured {peak:,} simulated {sim or 0:,} error {row['error']:+.1%} "
        f"saved {row['saved'] or 0:,} grad rel err {worst:.1e} ({compile_s:.0f} s)",
        flush=True,
    )
    if args.explain and captured:
        files = {getattr(m, "__file__", "") for m in (set(PyCodeCache.modules) - before)}
        work.model.zero_grad(set_to_none=True)
        _explain(captured, step, {f for f in files if f}, report.inductor_layout if report is not None else None)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--settings", nargs="+", default=["default", "mb0.5", "mb0.2", "mb0.0", "pb0.5", "pb0.0"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--hf-size", default="tiny")
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import torch._functorch.config as functorch_config

    fb = _backend_module()

    # the partitioner (and the simulator in it) runs on every compile; Inductor's FX graph cache, keyed on the
    # graphs it gets, still skips the C++ compile of a split seen before
    functorch_config.enable_autograd_cache = False
    fb.source_hash = lambda: "sim_gap"
    rows = [run_setting(args, s) for s in args.settings]
    print("| setting | saved | measured | simulated | error |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = [r["setting"], f"{r['saved'] or 0:,}", f"{r['measured']:,}", f"{r['simulated'] or 0:,}"]
        print(f"| {' | '.join(cells)} | {r['error']:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
