"""Step time of several configurations of one model, timed interleaved: issue #15's "step time <= 1.05x PyTorch's
(interleaved medians of >= 20 steps, three repetitions, quiet machine)".

    python benchmarks/step_interleaved.py --model llama_stack --size small --configs issue15 \\
        [--reference pytorch_default] [--steps 20] [--repetitions 3] [--json PATH] [--markdown PATH]
        [--checkpointed]

In one process, each configuration (``benchmarks/run.py``'s names, or a set name such as ``issue15``) compiles its
own fresh model (``bench_models.build_workload``: the same seed, so identical weights and inputs) with its own
backend (``bench_measure.make_backend``), in run.py's order, so that ``fxremat_at_pytorch_X`` takes the saved
bytes ``pytorch_budget_X`` measured a moment before.  Each gets warm-up steps; then, per repetition, one step of
each configuration in turn, ``--steps`` rounds, the round's first configuration rotating, so that a slow drift of
the machine (load, clocks) falls on every configuration alike and none always runs after the same neighbour
(Python's garbage collector paused meanwhile: ``collector_paused``).  The result, per configuration: the median
of each repetition, its ratio to ``--reference``'s median of the same repetition, and to PyTorch's at the same
setting (``SAME_SETTING``); the gradients of its first step against eager (``bench_measure.grad_errors``, as
run.py).

Every configuration shares this process's Inductor cache (an empty one, made for the run) and Dynamo state: fine
for step time, which is measured after compiling, but compile times here are not comparable (a configuration may
hit what an earlier one compiled), so none are reported; run.py measures them, one process per configuration.
Only on a quiet machine do the times mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this script

import bench_measure as bm  # noqa: E402
import bench_report as br  # noqa: E402
import run  # noqa: E402
from bench_models import ALL_MODELS, EXTRA_MODELS, SIZES  # noqa: E402

# fxremat configuration -> PyTorch's at the same setting (or at whose measured bytes it runs): issue #15's pairs.
SAME_SETTING = {
    "fxremat_default": "pytorch_default",
    **{f"fxremat_budget_{b}": f"pytorch_budget_{b}" for b in ("0.5", "0.2", "0.0")},
    **bm.BUDGET_SOURCES,
    **bm.PEAK_AT_SOURCES,
}
# Every configuration compiles the same model code with its own backend: one Dynamo cache entry per configuration
# per code object, past Dynamo's default limit of 8 (a configuration past it would silently run eagerly).
RECOMPILE_LIMIT = 64


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=[*ALL_MODELS, *EXTRA_MODELS])
    parser.add_argument(
        "--configs",
        nargs="+",
        required=True,
        metavar="NAME",
        help=f"configurations of run.py, or a set: {' '.join(bm.CONFIG_SETS)}",
    )
    parser.add_argument("--reference", default="pytorch_default", help="the configuration ratios are taken against")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration and repetition")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument(
        "--checkpointed", action="store_true", help="every block under torch.utils.checkpoint, as run.py --checkpointed"
    )
    args = parser.parse_args(argv)
    chosen = set(bm.expand_configs(args.configs))
    if chosen - set(bm.CONFIGS):
        parser.error(f"unknown configuration(s) {sorted(chosen - set(bm.CONFIGS))}; choose from {' '.join(bm.CONFIGS)}")
    args.configs = [c for c in bm.CONFIGS if c in chosen]  # run.py's order: budget sources first
    if args.reference not in args.configs:
        parser.error(f"--reference {args.reference} is not among --configs")
    if args.steps < 1 or args.repetitions < 1:
        parser.error("--steps and --repetitions must be at least 1")
    return args


# ---- compiling -------------------------------------------------------------------------------------------------


def compile_one(
    model: str, size: str, config: str, device: str, rows: list[dict], reference, checkpointed: bool = False
) -> dict[str, Any]:
    """A fresh model compiled for ``config`` and its first (compiling) step: the entry holds the workload, the
    compiled callable and the row so far (saved bytes, gradients), or only the row, with an ``error``."""
    import torch

    budget, missing = run.budget_for(model, config, rows)
    if missing:
        return dict(row=bm.error_row(model, size, config, device, missing))
    work = bm.build_workload(model, size, device, checkpointed=checkpointed)
    backend, first_call_context = bm.make_backend(config, budget)
    compiled = work.model if backend is None else torch.compile(work.model, backend=backend)  # eager: uncompiled
    graphs_before = bm.dynamo_graph_count()
    row = dict(model=model, config=config, size=size, device=device, memory_budget_bytes=budget, error=None)
    row.update(bm.first_step(compiled, work, device, first_call_context))
    row["graphs"] = bm.dynamo_graph_count() - graphs_before
    if row["graphs"] == 0:
        return dict(row=bm.error_row(model, size, config, device, "no graph compiled: the step ran eagerly"))
    error, near_zero = (None, []) if reference is None else bm.grad_errors(work.model, reference)
    row.update(max_grad_error=error, near_zero_grad_params=near_zero)
    row["grads_matched"] = None if error is None else bool(error < bm.GRAD_TOLERANCE)
    row.update(bm.fxremat_facts(backend))
    return dict(work=work, compiled=compiled, row=row)


def compile_all(args: argparse.Namespace, device: str) -> dict[str, dict[str, Any]]:
    """Every configuration compiled, in run.py's order; a failure is that configuration's error row."""
    first = bm.build_workload(args.model, args.size, device, checkpointed=args.checkpointed)
    reference = None if bm.has_dropout(first.model) else bm.eager_grads(first)
    entries: dict[str, dict[str, Any]] = {}
    for config in args.configs:
        print(f"compiling {args.model} / {config}", file=sys.stderr, flush=True)
        rows = [entry["row"] for entry in entries.values()]
        try:
            entries[config] = compile_one(args.model, args.size, config, device, rows, reference, args.checkpointed)
        except Exception as exc:  # noqa: BLE001 - one configuration failing must never abort the others
            message = f"{type(exc).__name__}: {exc}"
            entries[config] = dict(row=bm.error_row(args.model, args.size, config, device, message))
    return entries


# ---- timing ----------------------------------------------------------------------------------------------------


def round_robin(configs: list[str], rounds: int):
    """(round, configuration) for ``rounds`` rounds of every configuration, round i starting at configuration i."""
    n = len(configs)
    for i in range(rounds):
        for j in range(n):
            yield i, configs[(i + j) % n]


def time_interleaved(entries: dict[str, dict[str, Any]], steps: int, repetitions: int, device: str) -> None:
    """Warm-up, then per repetition ``steps`` interleaved rounds; each row gets ``step_ms_per_repetition`` (medians)
    and ``step_times_ms`` (every step, per repetition)."""
    ready = [config for config, entry in entries.items() if "compiled" in entry]
    for _, config in round_robin(ready, bm.WARMUP_STEPS):
        bm.timed_step(entries[config]["compiled"], entries[config]["work"], device)
    times: dict[str, list[list[float]]] = {config: [] for config in ready}
    for _ in range(repetitions):
        for config in ready:
            times[config].append([])
        with collector_paused():
            for _, config in round_robin(ready, steps):
                entry = entries[config]
                times[config][-1].append(bm.timed_step(entry["compiled"], entry["work"], device) * 1e3)
    for config in ready:
        row = entries[config]["row"]
        row["step_times_ms"] = times[config]
        row["step_ms_per_repetition"] = [statistics.median(rep) for rep in times[config]]
        row["step_ms"] = statistics.median(row["step_ms_per_repetition"])


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while steps are timed, as ``timeit`` does: compiling leaves a large
    heap, a full collection of it takes milliseconds, and it is triggered by allocation counts, so it can land
    on the same configuration's step round after round.  A training step's tensors are freed by reference
    counting, so nothing piles up in one repetition; the collection runs between repetitions instead."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def add_step_ratios(rows: dict[str, dict[str, Any]], reference: str) -> None:
    """Per repetition, each row's median over the reference's and over PyTorch's at the same setting (the median
    of those ratios in ``step_ratio`` / ``step_ratio_same_setting``; None where a side is missing)."""
    for config, row in rows.items():
        for key, other in (("step_ratio", reference), ("step_ratio_same_setting", SAME_SETTING.get(config))):
            base = rows.get(other) if other else None
            if row.get("error") or base is None or base.get("error"):
                row[key], row[key + "_per_repetition"] = None, None
                continue
            ratios = [a / b for a, b in zip(row["step_ms_per_repetition"], base["step_ms_per_repetition"])]
            row[key + "_per_repetition"] = ratios
            row[key] = statistics.median(ratios)
        row["same_setting_as"] = SAME_SETTING.get(config)


# ---- output ----------------------------------------------------------------------------------------------------

HEADERS = (
    "config",
    "saved MiB",
    "step ms (median per repetition)",
    "vs reference",
    "vs PyTorch same setting",
    "grads ok",
    "note",
)


def _ratios(row: dict[str, Any], key: str) -> str:
    per = row.get(key + "_per_repetition")
    return "" if not per else f"{row[key]:.3f}x (" + " / ".join(f"{r:.3f}" for r in per) + ")"


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    for config, row in rows.items():
        reps = " / ".join(f"{t:.2f}" for t in row.get("step_ms_per_repetition") or [])
        same = _ratios(row, "step_ratio_same_setting")
        same = f"{same} vs {row['same_setting_as']}" if same else ""
        cells = [
            config,
            br._fmt(row.get("saved_bytes"), ".2f", br.MIB),
            reps,
            _ratios(row, "step_ratio"),
            same,
            br._fmt_grads(row),
            br.row_note(row).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(run.THREADS)
    device = run.device()
    with run.fresh_inductor_cache(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        entries = compile_all(args, device)
        time_interleaved(entries, args.steps, args.repetitions, device)
    rows = {config: entry["row"] for config, entry in entries.items()}
    add_step_ratios(rows, args.reference)
    settings = dict(
        model=args.model,
        checkpointed=args.checkpointed,
        size=args.size,
        shape=SIZES[args.size],
        configs=args.configs,
        reference=args.reference,
        steps=args.steps,
        repetitions=args.repetitions,
        warmup=bm.WARMUP_STEPS,
        shared_inductor_cache=True,
    )
    result = dict(
        schema_version=1, environment=br.environment(run.THREADS), settings=settings, rows=list(rows.values())
    )
    name = f"{args.model} (checkpointed)" if args.checkpointed else args.model
    text = f"{name}, size {args.size}: {args.steps} interleaved steps x {args.repetitions} repetitions\n\n"
    text += table(rows)
    print(text, end="")
    if args.json:
        br.write_json(args.json, result)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
