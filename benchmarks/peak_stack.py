"""Activation peak of a stack of N blocks under fxremat's plans: does the lowest-peak plan grow like sqrt(N)?

    python benchmarks/peak_stack.py [--blocks 4 16 64] [--dim 64] [--batch 4] [--seq 64]

For each N: trace ``fxremat.examples.Stack(N, dim)``'s joint graph (aot_module, no Inductor), then partition it with
fxremat's default plan, ``memory_budget=0.0`` (fewest saved bytes) and ``peak_budget=0.0`` (the lowest peak the
peak search finds), and print each plan's saved bytes, simulated activation peak (passes/simulator/liveness.py) and partition
seconds.  sqrt(N) growth: 4x the blocks, about 2x the lowest peak.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_time import capture  # noqa: E402  (the same Stack joint graph the solve-time benchmark times)


def main(argv=None) -> int:
    from tabulate import tabulate

    from fxremat.options import Options
    from fxremat.partition import PartitionRequest, partition
    from fxremat.render import format_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for blocks in args.blocks:
        captured = capture(blocks, args.dim, args.batch, args.seq)
        joint, kwargs = captured["gm"], captured["kwargs"]
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
