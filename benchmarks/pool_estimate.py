"""Inductor's own memory estimate beside the simulator's replay of it, kernel by kernel, for one compiled backward.

    python benchmarks/pool_estimate.py llama_stack [--setting mb0.2] [--dim 256] [--graph -1] [--decisions]

Compiles the model with ``fxremat.backend(<setting>)`` (real Inductor, its FX graph cache off so the scheduler runs)
and hooks ``EfficientPeakEstimate`` (torch/_inductor/codegen/wrapper.py: ``estimate_peak_memory`` over the scheduler's
nodes, what ``AllocateLine.should_reuse_buffer`` compares a reuse against) and ``should_reuse_buffer`` itself.  Then
it replays the same split with ``passes/simulator/liveness.py`` and prints, per simulated kernel, our ``estimated`` (what
``_pool_held`` gets) beside Inductor's estimate at the scheduler node(s) holding that kernel's units (matched by the
FX nodes each scheduler node came from), with the scheduler nodes in between that no kernel of ours maps to.  Where
the two schedules agree the two columns are equal; where they differ the fusion or order differs (session 7).
``--decisions``: each reuse Inductor considered (freed buffer, its node, allocation, its node, bytes, estimate
between them, overall estimate, taken).  Settings as in ``sim_gap.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _hook_inductor(graphs: list) -> None:
    from torch._inductor.codegen import wrapper
    from torch._inductor.memory import estimate_peak_memory, get_freeable_input_buf
    from torch._inductor.virtualized import V

    init, should = wrapper.EfficientPeakEstimate.__init__, wrapper.AllocateLine.should_reuse_buffer

    def estimating(self):
        init(self)
        nodes = V.graph.scheduler.nodes
        freeable = get_freeable_input_buf(nodes, set(V.graph.graph_inputs))
        _, per_node = estimate_peak_memory(nodes, freeable, set(V.graph.get_output_names()))
        rows = []
        for i, n in enumerate(nodes):
            origins = {o.name for s in n.get_nodes() if s.node is not None for o in s.node.origins}
            rows.append((n.get_name(), origins, [b.get_name() for b in n.get_outputs()], per_node[i]))
        graphs.append({"peak": self.overall_peak_memory, "rows": rows, "decisions": []})

    def deciding(self, free_line, size):
        taken = should(self, free_line, size)
        a, b = free_line.scheduler_node_index, self.scheduler_node_index
        between = self.wrapper.estimate_peak.peak_between(free_line, self) if a + 1 < b else None
        row = (free_line.node.get_name(), a, self.node.get_name(), b, size, between, taken)
        graphs[-1]["decisions"].append(row)
        return taken

    wrapper.EfficientPeakEstimate.__init__ = estimating
    wrapper.AllocateLine.should_reuse_buffer = deciding


def _replay(fw, bw, num_fwd_outputs) -> list:
    """(phase, kernel's unit names, our estimate) per kernel, from one ``simulate_step`` run."""
    from fxremat_passes.simulator import liveness

    rows, held, run = [], liveness._pool_held, liveness._Phase.run
    current: list = []

    def pool(estimated, allocated, freed):
        current[:] = list(estimated)
        return held(estimated, allocated, freed)

    def running(self, phase, timeline, order=None):
        order = self.fusion_order() if order is None else order
        peak = run(self, phase, timeline, order)
        rows.extend((phase, [u.name for u in self.kernels[h]], e) for h, e in zip(order, current))
        return peak

    liveness._pool_held, liveness._Phase.run = pool, running
    try:
        liveness.simulate_step(fw, bw, num_fwd_outputs)
    finally:
        liveness._pool_held, liveness._Phase.run = held, run
    return rows


def _print(ours: list, inductor: dict, phase: str) -> None:
    first: dict[str, int] = {}
    for i, (_, origins, _, _) in enumerate(inductor["rows"]):
        for name in origins:
            first.setdefault(name, i)
    print(f"Inductor's overall estimate {inductor['peak']:,}")
    done = 0
    for k, (ph, units, estimate) in enumerate(r for r in ours if r[0] == phase):
        at = sorted({first[u] for u in units if u in first})
        for i in range(done, at[0] if at else done):
            name, _, bufs, est = inductor["rows"][i]
            print(f"       I{i:<4d} {est:>12,}  {name} {' '.join(bufs)}")
        done = max(done, at[-1] + 1) if at else done
        theirs = inductor["rows"][at[0]][3] if at else None
        diff = f"{estimate - theirs:+,}" if theirs is not None else "?"
        print(f"  k{k:<4d} {estimate:>12,}  I{at} {theirs or 0:>12,} diff {diff:>11}  {' '.join(units)[:70]}")


def main(argv=None) -> int:
    import sim_gap

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--setting", default="default")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--hf-size", default="tiny")
    parser.add_argument("--decisions", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    import fxremat

    functorch_config.enable_autograd_cache = False
    inductor_config.fx_graph_cache = False
    fb = sim_gap._backend_module()
    graphs: list = []
    _hook_inductor(graphs)
    captured, original = [], fb.partition

    def capturing(request, options):
        fw, bw, report = original(request, options)
        captured.append((fb.tp.copy_graph_module(fw), fb.tp.copy_graph_module(bw), request.num_fwd_outputs))
        return fw, bw, report

    fb.partition = capturing
    try:
        work = sim_gap._workload(args)
        compiled = torch.compile(
            work.model, backend=fxremat.backend(compare_default=False, **sim_gap._options(args.setting))
        )
        work.loss(work.forward(compiled)).backward()
    finally:
        fb.partition = original
    # Inductor compiles forward then backward: the last estimate is the last backward's
    _print(_replay(*captured[-1]), graphs[-1], "backward")
    if args.decisions:
        print("reuse decisions (freed, node, allocated, node, bytes, estimate between, taken):")
        for row in graphs[-1]["decisions"]:
            print("  ", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
