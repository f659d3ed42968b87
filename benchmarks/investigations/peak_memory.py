"""Simulated vs measured peak memory of one training step, fxremat and PyTorch default, on the example models and
small transformers models.

    python benchmarks/investigations/peak_memory.py [--models mlp block_sdpa block_softmax stack convnet gpt2 llama]
                                     [--dim 256] [--seq 128] [--hf-size small]

For each model: compile with fxremat (whose report carries the liveness simulation of its own split and of PyTorch's
default split of the same joint graph) and with PyTorch's default Inductor, warm both up, then measure one step's
peak with the CPU profiler's memory events (CUDA allocator statistics on a GPU): bytes above what was live at the
step's start, gradients included (they are set to None before the step, outside the measured window, so both
sides allocate them).  The example models take ``--dim``/``--seq`` (batch 4); the transformers models (random
weights, ``benchmarks/bench_models.py``) take ``--hf-size``.  A model that compiles to more than one graph (a graph
break) has no single simulated step; it is reported as such.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and measures

EXAMPLES = ("mlp", "block_sdpa", "block_softmax", "stack", "convnet")


def _workload(name: str, args):
    import bench_models

    if name in EXAMPLES:
        from fxremat.examples import example

        torch.manual_seed(0)
        model, inputs = example(name, dim=args.dim, seq=args.seq)
        return bench_models.Workload(model, args=tuple(inputs))
    return bench_models.build_workload(name, args.hf_size)


def main(argv=None) -> int:
    from tabulate import tabulate

    import fxremat
    from fxremat.measure import step_peak_bytes
    from fxremat.render import format_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*EXAMPLES, "gpt2", "llama"])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hf-size", default="small", help="bench_models size of the transformers models")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name in args.models:
        # a fresh Dynamo per model: functions the transformers models share would otherwise hit Dynamo's recompile
        # limit after a few models and run eagerly (Mixtral did, last in a 12-model run: "0 graphs")
        torch._dynamo.reset()
        work = _workload(name, args).to(device)
        backend = fxremat.backend(compare_default=True)  # the report's simulation of PyTorch's split too
        runs = {"fxremat": (work.model, torch.compile(work.model, backend=backend))}
        default_model = copy.deepcopy(work.model)
        runs["PyTorch default"] = (default_model, torch.compile(default_model, backend="inductor"))
        for label, (m, compiled) in runs.items():

            def step(compiled=compiled):
                work.loss(work.forward(compiled)).backward()

            for _ in range(2):
                m.zero_grad(set_to_none=True)
                step()
            # Gradients are dropped outside the measured window: freeing them inside it would count memory of an
            # earlier step (and the profiler sizes such a free by whatever block last had that address).
            m.zero_grad(set_to_none=True)
            peak, _ = step_peak_bytes(step, device)
            if len(backend.reports) != 1:
                rows.append([name, label, f"({len(backend.reports)} graphs)", format_bytes(peak), "-"])
                continue
            report = backend.reports[0]
            simulated = report.simulated_peak_bytes if label == "fxremat" else report.baseline_simulated_peak_bytes
            error = (simulated - peak) / peak if simulated and peak else float("nan")
            rows.append([name, label, format_bytes(simulated), format_bytes(peak), f"{error:+.1%}"])
        print(rows[-2], rows[-1], file=sys.stderr, flush=True)
    print(
        tabulate(rows, headers=["model", "partitioner", "simulated peak", "measured peak", "error"], tablefmt="github")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
