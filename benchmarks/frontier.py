"""The memory/recompute frontier of one joint graph: fxremat's budgets against PyTorch's, at equal saved bytes.

    python benchmarks/frontier.py [--model block_sdpa] [--batch 4] [--seq 256] [--dim 256]

Captures the joint graph Inductor hands its partitioner (after its joint-graph passes, so RNG is already in seed
form), then partitions copies of it in-process:
  - PyTorch's ``min_cut_rematerialization_partition`` at ``activation_memory_budget`` 1.0 / 0.5 / 0.1 / 0.0;
  - fxremat at the absolute saved bytes each PyTorch budget reached (a fair comparison: the two fractions mean
    different things), and fxremat's own frontier (the hull vertices its price search finds).
Saved bytes come from the split graphs (distinct storages handed to backward, inputs excluded: the same count
``saved_tensors_hooks`` gives, see tests/e2e); estimated recompute seconds from fxremat's cost model (CPU profile)
applied to the nodes each backward graph recomputes.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from fxremat_passes import _torch_private as tp  # noqa: E402

_captured: dict = {}


class Capture(tp.CustomPartitionerFn):
    """Records the joint graph, then lets PyTorch's default partitioner finish the compile."""

    def __call__(self, gm, joint_inputs, **kwargs):
        _captured.update(gm=tp.copy_graph_module(gm), inputs=joint_inputs, kwargs=kwargs)
        return tp.min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)

    def uuid(self):
        return f"capture-{time.time()}"  # never a cache hit: we need the call


def capture_inductor_joint(model, inputs):
    """The joint graph as Inductor's partitioner receives it."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": Capture()})

    torch.compile(model, backend=backend)(*inputs).sum().backward()
    return dict(_captured)


def main(argv=None) -> int:
    from tabulate import tabulate

    from fxremat.examples import example
    from fxremat.options import Options
    from fxremat.partition import PartitionRequest, partition
    from fxremat.render import format_bytes
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.rewrite.describe import describe_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="block_sdpa")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--dim", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, inputs = example(args.model, batch=args.batch, seq=args.seq, dim=args.dim)
    cap = capture_inductor_joint(model, inputs)
    gm, joint_inputs, kwargs = cap["gm"], cap["inputs"], cap["kwargs"]
    n_out = kwargs["num_fwd_outputs"]
    profile = PROFILES["cpu"]

    rows = []
    for budget in (1.0, 0.5, 0.1, 0.0):
        start = time.perf_counter()
        with torch._functorch.config.patch(activation_memory_budget=budget):
            fw, bw = tp.min_cut_rematerialization_partition(tp.copy_graph_module(gm), joint_inputs, **kwargs)
        seconds = time.perf_counter() - start
        d = describe_split(fw, bw, n_out, profile)
        rows.append(["PyTorch", f"budget {budget}", d.saved_bytes, d.recompute_seconds, seconds])

    def fxremat_run(**options):
        request = PartitionRequest(
            tp.copy_graph_module(gm), joint_inputs, n_out, kwargs.get("static_lifetime_input_indices"), "frontier"
        )
        start = time.perf_counter()
        _, _, report = partition(request, Options.create(strict=True, **options))
        return report, time.perf_counter() - start

    default, seconds = fxremat_run(compare_default=True)  # the report's frontier comes with the comparison
    rows.append(["fxremat", "default", default.saved_bytes, default.est_recompute_seconds, seconds])
    for budget in (1.0, 0.5, 0.1, 0.0):
        target = next(r[2] for r in rows if r[1] == f"budget {budget}")
        report, seconds = fxremat_run(memory_budget=int(target), compare_default=False)
        label = f"at PyTorch {budget}'s bytes" + ("" if report.budget_met else " (unreachable)")
        rows.append(["fxremat", label, report.saved_bytes, report.est_recompute_seconds, seconds])
    zero, seconds = fxremat_run(memory_budget=0.0, compare_default=False)
    rows.append(["fxremat", "budget 0.0 (fewest bytes)", zero.saved_bytes, zero.est_recompute_seconds, seconds])

    print(f"{args.model}, batch {args.batch}, seq {args.seq}, dim {args.dim}, fp32; {len(gm.graph.nodes)} joint nodes")
    print(
        tabulate(
            [[a, b, format_bytes(c), f"{d * 1e6:.0f}", f"{e:.2f}"] for a, b, c, d, e in rows],
            headers=["partitioner", "configuration", "saved", "est. recompute us", "partition s"],
            tablefmt="github",
        )
    )
    print("\nfxremat frontier (hull vertices of its price search):")
    print(
        tabulate(
            [[format_bytes(b), f"{s * 1e6:.0f}", f"{p:.3g}"] for b, s, p in default.frontier],
            headers=["saved", "est. recompute+traffic us", "memory_price"],
            tablefmt="github",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
