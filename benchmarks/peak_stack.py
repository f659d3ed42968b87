"""Activation peak of a stack of N blocks under fxremat's plans: does the lowest-peak plan grow like sqrt(N)?

    python benchmarks/peak_stack.py [--blocks 4 16 64] [--dim 64] [--batch 4] [--seq 64]

For each N: trace ``fxremat.examples.Stack(N, dim)``'s joint graph (aot_module, no Inductor), then partition it with
fxremat's default plan, ``memory_budget=0.0`` (fewest saved bytes) and ``peak_budget=0.0`` (the lowest peak the
peak search finds), and print each plan's saved bytes, simulated activation peak (passes/liveness.py) and partition
seconds.  sqrt(N) growth: 4x the blocks, about 2x the lowest peak.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings


def capture(blocks: int, dim: int, batch: int, seq: int):
    import torch
    from functorch.compile import aot_module, make_boxed_func
    from torch._functorch.partitioners import default_partition

    from fxremat.examples import Stack

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured.update(gm=copy.deepcopy(gm), kwargs=kwargs)
        return default_partition(gm, joint_inputs, **kwargs)

    torch.manual_seed(0)
    compiled = aot_module(
        Stack(blocks, dim=dim), fw_compiler=lambda g, i: make_boxed_func(g.forward), partition_fn=partition_fn
    )
    compiled(torch.randn(batch, seq, dim)).sum().backward()
    return captured["gm"], captured["kwargs"]


def main(argv=None) -> int:
    from tabulate import tabulate

    from fxremat.options import Options
    from fxremat.partition import PartitionRequest, partition
    from fxremat.report import format_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for blocks in args.blocks:
        joint, kwargs = capture(blocks, args.dim, args.batch, args.seq)
        for label, options in (
            ("default", {}),
            ("memory_budget=0.0", dict(memory_budget=0.0)),
            ("peak_budget=0.0", dict(peak_budget=0.0)),
        ):
            request = PartitionRequest(copy.deepcopy(joint), None, kwargs["num_fwd_outputs"], None, f"stack{blocks}")
            start = time.perf_counter()
            _, _, report = partition(request, Options.create(compare_default=False, strict=True, **options))
            rows.append(
                [
                    blocks,
                    label,
                    format_bytes(report.saved_bytes),
                    format_bytes(report.simulated_activation_peak_bytes),
                    f"{time.perf_counter() - start:.1f}",
                ]
            )
            print(rows[-1], file=sys.stderr, flush=True)
    print(
        tabulate(
            rows, headers=["blocks", "plan", "saved", "simulated activation peak", "partition s"], tablefmt="github"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
