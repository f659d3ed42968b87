"""Simulated activation peak as the budget drops: fxremat's peak_budget against PyTorch's activation_memory_budget.

    python benchmarks/peak_curve.py [--models mlp block_sdpa stack llama_stack ...] [--size small] [--markdown PATH]

For each model, capture the joint graph Inductor would partition (Dynamo + AOTAutograd with Inductor's
decompositions, no code generation: seconds, not minutes) and, on copies of it:
  - fxremat at peak_budget 1.0, 0.75, 0.5, 0.25, 0.0 (fractions from its default plan's peak down to the lowest
    peak it finds), and at memory_budget 0.5 and 0.0 (bytes-only budgets, for contrast);
  - PyTorch's min-cut partitioner at activation_memory_budget 1.0, 0.5, 0.25, 0.1, 0.0, and beside each, fxremat's
    lowest-peak plan within the bytes PyTorch saved there (memory_budget=those bytes, peak_budget=0.0);
and simulate each split's step with ``passes/simulator/liveness.py``: saved bytes and activation peak (gradients excluded).
Monotone means: every row's activation peak is <= the row above it in its own curve.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

FXREMAT_POINTS = (
    ("peak_budget", 1.0),
    ("peak_budget", 0.75),
    ("peak_budget", 0.5),
    ("peak_budget", 0.25),
    ("peak_budget", 0.0),
    ("memory_budget", 0.5),
    ("memory_budget", 0.0),
)
PYTORCH_POINTS = (1.0, 0.5, 0.25, 0.1, 0.0)


def capture_joints(work) -> list[dict]:
    """Every joint graph of one compiled training step, with the partitioner's arguments."""
    from functorch.compile import make_boxed_func
    from torch._functorch.partitioners import default_partition

    from fxremat_passes import _torch_private as tp

    captured: list[dict] = []

    def partition_fn(gm, joint_inputs, **kwargs):
        captured.append(dict(joint=tp.copy_graph_module(gm), joint_inputs=joint_inputs, kwargs=kwargs))
        return default_partition(gm, joint_inputs, **kwargs)

    torch._dynamo.reset()
    backend = tp.aot_autograd_as_inductor(partition_fn, lambda gm, _: make_boxed_func(gm.forward))
    compiled = torch.compile(work.model, backend=backend)
    work.loss(work.forward(compiled)).backward()
    return captured


def curves(entry: dict) -> list[tuple[str, float, int, int]]:
    """(partitioner, budget, saved bytes, simulated activation peak) per point."""
    from fxremat.options import Options
    from fxremat.partition import PartitionRequest, partition
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.rewrite.describe import describe_split
    from fxremat_passes.simulator.liveness import simulate_step

    kwargs = entry["kwargs"]
    rows = []

    def fxremat(**options):
        request = PartitionRequest(
            tp.copy_graph_module(entry["joint"]),
            entry["joint_inputs"],
            kwargs["num_fwd_outputs"],
            kwargs.get("static_lifetime_input_indices"),
            "curve",
        )
        _, _, report = partition(request, Options.create(compare_default=False, strict=True, **options))
        return report.saved_bytes, report.simulated_activation_peak_bytes

    for option, value in FXREMAT_POINTS:
        rows.append((f"fxremat {option}", value, *fxremat(**{option: value})))
    for budget in PYTORCH_POINTS:
        fw, bw = tp.pytorch_default_partition(
            tp.copy_graph_module(entry["joint"]),
            entry["joint_inputs"],
            num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
            activation_memory_budget=budget,
        )
        saved = describe_split(fw, bw, kwargs["num_fwd_outputs"], PROFILES["cpu"]).saved_bytes
        peak = simulate_step(fw, bw, kwargs["num_fwd_outputs"]).activation_peak_bytes
        rows.append(("PyTorch activation_memory_budget", budget, saved, peak))
        if budget < 1.0:  # the lowest peak fxremat finds within the bytes PyTorch saves at this budget
            rows.append(
                ("fxremat peak 0.0 within PyTorch's bytes", budget, *fxremat(memory_budget=saved, peak_budget=0.0))
            )
    return rows


def monotone(rows: list[tuple[str, float, int, int]], label: str) -> bool:
    peaks = [peak for name, _, _, peak in rows if name == label]
    return all(b <= a for a, b in zip(peaks, peaks[1:]))


def main(argv=None) -> int:
    import warnings

    from bench_models import build_workload
    from tabulate import tabulate

    from fxremat.render import format_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block_sdpa", "block_softmax", "stack", "convnet"])
    parser.add_argument("--size", default="small")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    table, verdicts = [], []
    for name in args.models:
        work = build_workload(name, args.size)
        for g, entry in enumerate(capture_joints(work)):
            rows = curves(entry)
            label = name if g == 0 else f"{name} (graph {g})"
            for who, budget, saved, peak in rows:
                table.append([label, who, budget, format_bytes(saved), format_bytes(peak)])
            ours = monotone(rows[:5], "fxremat peak_budget")
            theirs = monotone(rows, "PyTorch activation_memory_budget")
            verdicts.append([label, "yes" if ours else "NO", "yes" if theirs else "no"])
            print(f"{label}: fxremat monotone {ours}, PyTorch monotone {theirs}", file=sys.stderr, flush=True)
    text = tabulate(
        table, headers=["model", "partitioner / option", "budget", "saved", "sim. act. peak"], tablefmt="github"
    )
    text += "\n\n" + tabulate(
        verdicts, headers=["model", "fxremat peak monotone", "PyTorch peak monotone"], tablefmt="github"
    )
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
