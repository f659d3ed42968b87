"""The demo: compile a small transformer with fxremat and with PyTorch's default Inductor, train one step each,
and print what each keeps for backward, what it recomputes, and its step time, side by side.

    python -m fxremat.demo [--depth 2] [--dim 256] [--seq 128] [--batch 4] [--repeats 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fxremat-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--memory-price", type=float, default=None)
    args = parser.parse_args(argv)

    from tabulate import tabulate

    import fxremat
    from fxremat.examples import Stack
    from fxremat.measure import gradient_errors, measure_saved
    from fxremat.report import format_bytes

    torch.set_num_threads(1)  # CPU timings are only comparable on one thread
    torch.manual_seed(0)
    eager = Stack(args.depth, args.dim)
    x = torch.randn(args.batch, args.seq, args.dim)
    eager(x).sum().backward()
    reference = {n: p.grad.detach().clone() for n, p in eager.named_parameters()}

    # compare_default=True: the demo shows PyTorch's default partition of the same graphs beside fxremat's (off by
    # default: a production compile runs nothing for the report)
    options = {"compare_default": True}
    if args.memory_price is not None:
        options["memory_price"] = args.memory_price
    fx_backend = fxremat.backend(**options)
    runs = {}
    for label, backend in (("fxremat", fx_backend), ("PyTorch default", "inductor")):
        model = copy.deepcopy(eager)
        model.zero_grad(set_to_none=True)
        compiled = torch.compile(model, backend=backend)
        start = time.perf_counter()
        exclude = [*model.parameters(), *model.buffers(), x]
        out, saved = measure_saved(lambda: compiled(x), exclude)
        out.sum().backward()
        compile_seconds = time.perf_counter() - start
        errors = gradient_errors(model, reference)
        print(f"compiled with {label} in {compile_seconds:.1f} s", file=sys.stderr)
        runs[label] = dict(model=model, compiled=compiled, saved=saved, errors=errors, times=[])

    def step(run):
        run["model"].zero_grad(set_to_none=True)
        start = time.perf_counter()
        run["compiled"](x).sum().backward()
        run["times"].append(time.perf_counter() - start)

    for _ in range(3):  # warm-up
        for run in runs.values():
            step(run)
    for run in runs.values():
        run["times"].clear()
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for run in runs.values():
            step(run)

    report = fx_backend.reports[0]
    ours, theirs = runs["fxremat"], runs["PyTorch default"]
    t_ours, t_theirs = statistics.median(ours["times"]), statistics.median(theirs["times"])
    rows = [
        [
            "saved activation bytes (measured)",
            format_bytes(ours["saved"].nbytes),
            format_bytes(theirs["saved"].nbytes),
            f"{ours['saved'].nbytes / max(theirs['saved'].nbytes, 1):.2f}x",
        ],
        ["recompute FLOPs", f"{report.recompute_flops:,}", f"{report.baseline_recompute_flops:,}", ""],
        [
            "est. recompute time",
            f"{report.est_recompute_seconds * 1e6:.0f} us",
            f"{report.baseline_est_recompute_seconds * 1e6:.0f} us",
            "",
        ],
        [
            f"step time (median of {args.repeats})",
            f"{t_ours * 1e3:.2f} ms",
            f"{t_theirs * 1e3:.2f} ms",
            f"{t_ours / t_theirs:.2f}x",
        ],
        [
            "max gradient error vs eager",
            f"{max(ours['errors'].values()):.1e}",
            f"{max(theirs['errors'].values()):.1e}",
            "",
        ],
    ]
    print(
        f"\n{args.depth}-block pre-LN transformer, batch {args.batch}, seq {args.seq}, dim {args.dim}, fp32, "
        f"CPU, 1 thread\n"
    )
    print(tabulate(rows, headers=["", "fxremat", "PyTorch default", "ratio"]))
    print()
    print(fxremat.format_text(report, max_rows=12))
    worst = max(max(ours["errors"].values()), max(theirs["errors"].values()))
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
