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


def _warm_up_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x @ w, (w.shape[-1],)).unsqueeze(1)
    return torch.nn.functional.scaled_dot_product_attention(y, y, y, is_causal=True).relu().sum()


def _warm_up_inductor() -> None:
    """Pay Inductor's one-time start-up in this process (its imports, the C++ toolchain's first build, the first
    lowering of each op kind) with a tiny step of the same ops compiled by Inductor alone, so that neither timed
    compile pays it: otherwise whichever compiles first, fxremat here, is charged it.  What fxremat itself loads on
    first use (scipy's max-flow) stays in its time.  A function of its own, not the demo's model: Dynamo would mark
    the model's dimensions dynamic on seeing a second shape."""
    from fxremat_passes import _torch_private as tp

    step = torch.compile(_warm_up_step, backend="inductor")
    with tp.fresh_inductor_cache():
        step(torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)).backward()


def _compile_both(eager: torch.nn.Module, x: torch.Tensor, reference: dict, fx_backend) -> dict[str, dict]:
    """Each backend compiles its own copy of the model and runs one step, timed, in an empty Inductor cache of its
    own (so neither reuses the other's kernels), after ``_warm_up_inductor``."""
    from fxremat.measure import gradient_errors, measure_saved
    from fxremat_passes import _torch_private as tp

    _warm_up_inductor()
    runs = {}
    for label, backend in (("fxremat", fx_backend), ("PyTorch default", "inductor")):
        model = copy.deepcopy(eager)
        model.zero_grad(set_to_none=True)
        with tp.fresh_inductor_cache():
            compiled = torch.compile(model, backend=backend)
            start = time.perf_counter()
            exclude = [*model.parameters(), *model.buffers(), x]
            out, saved = measure_saved(lambda: compiled(x), exclude)
            out.sum().backward()
            compile_seconds = time.perf_counter() - start
        errors = gradient_errors(model, reference)
        print(
            f"compiled with {label} in {compile_seconds:.1f} s (compile and first step, in an empty Inductor cache, "
            "after a warm-up compile that paid Inductor's one-time start-up)",
            file=sys.stderr,
        )
        runs[label] = dict(model=model, compiled=compiled, saved=saved, errors=errors, times=[])
    return runs


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fxremat-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--memory-price", type=float, default=None)
    return parser.parse_args(argv)


def _time_steps(runs: dict[str, dict], x: torch.Tensor, repeats: int) -> None:
    """Three warm-up steps each, then ``repeats`` steps each, interleaved so that drift hits both alike."""

    def step(run):
        run["model"].zero_grad(set_to_none=True)
        start = time.perf_counter()
        run["compiled"](x).sum().backward()
        run["times"].append(time.perf_counter() - start)

    for _ in range(3):
        for run in runs.values():
            step(run)
    for run in runs.values():
        run["times"].clear()
    for _ in range(repeats):
        for run in runs.values():
            step(run)


def _table_rows(report, ours: dict, theirs: dict, repeats: int) -> list[list[str]]:
    from fxremat.render import format_bytes

    t_ours, t_theirs = statistics.median(ours["times"]), statistics.median(theirs["times"])
    saved_ours, saved_theirs = ours["saved"].nbytes, theirs["saved"].nbytes
    return [
        ["saved activation bytes (measured)", format_bytes(saved_ours), format_bytes(saved_theirs),
         f"{saved_ours / max(saved_theirs, 1):.2f}x"],
        ["recompute FLOPs", f"{report.recompute_flops:,}", f"{report.baseline_recompute_flops:,}", ""],
        ["est. recompute time", f"{report.est_recompute_seconds * 1e6:.0f} us",
         f"{report.baseline_est_recompute_seconds * 1e6:.0f} us", ""],
        [f"step time (median of {repeats})", f"{t_ours * 1e3:.2f} ms", f"{t_theirs * 1e3:.2f} ms",
         f"{t_ours / t_theirs:.2f}x"],
        ["max gradient error vs eager", f"{max(ours['errors'].values()):.1e}",
         f"{max(theirs['errors'].values()):.1e}", ""],
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from tabulate import tabulate

    import fxremat
    from fxremat.examples import Stack

    torch.set_num_threads(1)  # CPU timings are only comparable on one thread
    torch.manual_seed(0)
    eager = Stack(args.depth, args.dim)
    x = torch.randn(args.batch, args.seq, args.dim)
    eager(x).sum().backward()
    reference = {n: p.grad.detach().clone() for n, p in eager.named_parameters()}

    # compare_default=True: the demo shows PyTorch's default partition of the same graphs beside fxremat's (off by
    # default: a production compile runs nothing for the report)
    options = {"compare_default": True, "caller_bytes": 0}  # the loss, ``.sum()``, holds nothing between the graphs
    if args.memory_price is not None:
        options["memory_price"] = args.memory_price
    fx_backend = fxremat.backend(**options)
    runs = _compile_both(eager, x, reference, fx_backend)
    _time_steps(runs, x, args.repeats)

    report = fx_backend.reports[0]
    ours, theirs = runs["fxremat"], runs["PyTorch default"]
    print(
        f"\n{args.depth}-block pre-LN transformer, batch {args.batch}, seq {args.seq}, dim {args.dim}, fp32, "
        f"CPU, 1 thread\n"
    )
    print(
        tabulate(_table_rows(report, ours, theirs, args.repeats), headers=["", "fxremat", "PyTorch default", "ratio"])
    )
    print()
    print(fxremat.format_text(report, max_rows=12))
    worst = max(max(ours["errors"].values()), max(theirs["errors"].values()))
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
