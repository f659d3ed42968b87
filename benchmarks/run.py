"""Training-step benchmark: fxremat against PyTorch's partitioner, per model and configuration.

    python benchmarks/run.py [--quick] [--models NAMES] [--configs NAMES] [--size tiny|small|medium]
                             [--json PATH] [--markdown PATH] [--plot PATH] [--repeats N] [--timeout S]
                             [--checkpointed]

Each model x configuration runs in a fresh process (this script in its hidden ``--worker`` mode, which prints one
JSON line) with its own empty Inductor cache, so no compile state leaks from one run into the next.  The PyTorch
budget runs go first: ``fxremat_at_pytorch_X`` gives fxremat, as an absolute budget, the saved bytes that
``pytorch_budget_X`` measured.  ``--quick``: the MLP, two configurations, in this process.  ``--configs`` also
takes set names (``bench_measure.CONFIG_SETS``): ``--configs issue15`` runs every setting issue #15 judges, and
benchmarks/peak_table.py turns that JSON into its table.  ``--checkpointed``: every model's blocks under
``torch.utils.checkpoint`` (``bench_models.checkpoint_blocks``), by default eager, Inductor's default and
fxremat's default (issue #22: compiling a checkpointed model must not cost memory).  See benchmarks/README.md for
what each column means.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this script

import bench_measure as bm  # noqa: E402
import bench_report as br  # noqa: E402
from bench_models import ALL_MODELS, EXTRA_MODELS, SIZES  # noqa: E402

ROW_MARKER = "FXREMAT_BENCH_ROW "  # the worker's result line; everything else it prints is noise to us
THREADS = 1  # CPU step times are only comparable on one thread (and this machine is shared)
QUICK_MODELS = ("mlp",)

Runner = Callable[[str, str, "int | None"], dict]  # (model, config, budget bytes) -> row


# ---- command line ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the MLP, pytorch_default vs fxremat_default, in-process")
    more_configs = " ".join(c for c in bm.CONFIGS if c not in bm.DEFAULT_CONFIGS)
    sets = ", ".join(bm.CONFIG_SETS)
    parser.add_argument(
        "--models",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"default: {' '.join(ALL_MODELS)}; also: {' '.join(EXTRA_MODELS)}",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"default: {' '.join(bm.DEFAULT_CONFIGS)}; also: {more_configs}; or a set: {sets} (see the README)",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default: small (tiny with --quick)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps; the median is reported")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one worker process")
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument("--plot", default=None, metavar="PATH", help="PNG (needs matplotlib; skipped without)")
    parser.add_argument(
        "--shared-cache",
        default=None,
        metavar="DIR",
        help="one Inductor cache for every row (faster when only peaks, saved bytes and gradients are wanted; compile "
        "seconds are then not comparable and each row says so)",
    )
    parser.add_argument(
        "--reuse-pytorch",
        default=None,
        metavar="JSON",
        help="take the PyTorch rows (pytorch_*) of the same models and size from an earlier run's JSON instead of "
        "running them again (fxremat_at_pytorch_X then uses their saved bytes); each such row is marked",
    )
    parser.add_argument(
        "--checkpointed",
        action="store_true",
        help="every model's blocks under torch.utils.checkpoint (default configs: eager pytorch_default "
        "fxremat_default)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--budget-bytes", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    apply_defaults(args)
    for config in args.configs:
        if config not in bm.CONFIGS:
            parser.error(
                f"unknown configuration {config!r}; choose from {' '.join(bm.CONFIGS)} or a set "
                f"({' '.join(bm.CONFIG_SETS)})"
            )
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def apply_defaults(args: argparse.Namespace) -> None:
    """--quick's models and configurations, the default ones otherwise; configuration set names expanded."""
    if args.quick:
        args.models = args.models or list(QUICK_MODELS)
        args.configs = args.configs or list(bm.CHECKPOINTED_CONFIGS if args.checkpointed else bm.QUICK_CONFIGS)
    args.models = args.models or list(ALL_MODELS)
    defaults = bm.CHECKPOINTED_CONFIGS if args.checkpointed else bm.DEFAULT_CONFIGS
    args.configs = bm.expand_configs(args.configs or list(defaults))
    args.size = args.size or ("tiny" if args.quick else "small")


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# ---- worker mode -----------------------------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> int:
    """One model x one configuration, in this (fresh) process; prints the row as one marked JSON line."""
    import torch

    torch.set_num_threads(THREADS)
    if len(args.models) != 1 or len(args.configs) != 1:
        raise SystemExit("--worker runs exactly one --models NAME and one --configs NAME")
    row = bm.measure_or_error(
        args.models[0], args.size, args.configs[0], args.repeats, device(), args.budget_bytes, args.checkpointed
    )
    print(ROW_MARKER + json.dumps(row, default=str), flush=True)
    return 0


def parse_worker_output(stdout: str) -> dict | None:
    rows = [line[len(ROW_MARKER) :] for line in stdout.splitlines() if line.startswith(ROW_MARKER)]
    return json.loads(rows[-1]) if rows else None


def worker_command(
    model: str, config: str, size: str, repeats: int, budget: int | None, checkpointed: bool = False
) -> list[str]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--models",
        model,
        "--configs",
        config,
        "--size",
        size,
        "--repeats",
        str(repeats),
    ]
    command += ["--checkpointed"] if checkpointed else []
    return command + ([] if budget is None else ["--budget-bytes", str(budget)])


def subprocess_runner(
    size: str, repeats: int, timeout: float, shared_cache: str | None = None, checkpointed: bool = False
) -> Runner:
    def run(model: str, config: str, budget: int | None) -> dict:
        cache = shared_cache or tempfile.mkdtemp(prefix="fxremat-bench-inductor-")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                worker_command(model, config, size, repeats, budget, checkpointed),
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return bm.error_row(model, size, config, device(), f"worker timed out after {timeout:.0f} s")
        finally:
            if shared_cache is None:
                shutil.rmtree(cache, ignore_errors=True)
        row = parse_worker_output(proc.stdout)
        if row is None:
            return bm.error_row(
                model, size, config, device(), f"worker exited with {proc.returncode} and no result", proc.stderr
            )
        row["worker_s"] = time.perf_counter() - start
        if shared_cache is not None:
            row["compile_cache_shared"] = True  # compile_s is not a cold compile's
        return row

    return run


def in_process_runner(size: str, repeats: int, checkpointed: bool = False) -> Runner:
    """--quick: no subprocess; each configuration still gets an empty Inductor cache (disk and memory)."""
    import torch

    torch.set_num_threads(THREADS)

    def run(model: str, config: str, budget: int | None) -> dict:
        torch._dynamo.reset()
        with fresh_inductor_cache():
            return bm.measure_or_error(model, size, config, repeats, device(), budget, checkpointed)

    return run


def fresh_inductor_cache():
    try:
        from torch._inductor.utils import fresh_cache
    except ImportError:  # private API: without it, runs share the cache and only compile times suffer
        return contextlib.nullcontext()
    return fresh_cache()


# ---- orchestration ---------------------------------------------------------------------------------------------


def plan(models: Iterable[str], configs: Iterable[str]) -> list[tuple[str, str]]:
    """(model, config) in run order: per model, configurations in CONFIGS order, so each PyTorch budget run comes
    before the fxremat run that takes its measured bytes as a budget."""
    chosen = set(configs)
    return [(model, config) for model in models for config in bm.CONFIGS if config in chosen]


def budget_for(model: str, config: str, rows: list[dict]) -> tuple[int | None, str | None]:
    """(absolute budget in bytes, None) for fxremat_at_pytorch_X, from the measured pytorch_budget_X row of the same
    model; (None, why not) when that row is missing or failed; (None, None) for configurations without one."""
    source = {**bm.BUDGET_SOURCES, **bm.PEAK_AT_SOURCES}.get(config)
    if source is None:
        return None, None
    for row in rows:
        if row["model"] == model and row["config"] == source and not row.get("error"):
            return int(row["saved_bytes"]), None
    return None, f"needs a successful {source} run of {model} for its budget (add it to --configs)"


def run_all(runs: list[tuple[str, str]], runner: Runner, size: str, on_row=None, reused=None) -> list[dict]:
    """Each run's row; ``reused``: rows of an earlier JSON of the same size whose PyTorch configurations are taken
    as they are (marked ``reused_from``) instead of being run again."""
    rows: list[dict] = []
    earlier = {(r["model"], r["config"]): r for r in reused or () if not r.get("error")}
    for model, config in progress(runs):
        budget, missing = budget_for(model, config, rows)
        if config.startswith("pytorch") and (model, config) in earlier:
            row = dict(earlier[(model, config)], reused_from="--reuse-pytorch")
        elif missing:
            row = bm.error_row(model, size, config, device(), missing)
        else:
            try:
                row = runner(model, config, budget)
            except Exception as exc:  # noqa: BLE001 - one run failing must never abort the others
                row = bm.error_row(model, size, config, device(), f"{type(exc).__name__}: {exc}")
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def progress(runs: list[tuple[str, str]]):
    """tqdm over the runs when it is installed, else one line per run on stderr."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(runs, unit="run", file=sys.stderr, dynamic_ncols=True)
        for model, config in bar:
            bar.set_postfix_str(f"{model} / {config}")
            yield model, config
        return
    for i, (model, config) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {model} / {config}", file=sys.stderr, flush=True)
        yield model, config


def log_row(row: dict) -> None:
    if row.get("error"):
        print(f"  {row['model']} / {row['config']}: {row['error'].splitlines()[0][:200]}", file=sys.stderr, flush=True)


def build_result(args: argparse.Namespace, rows: list[dict]) -> dict[str, Any]:
    settings = dict(
        size=args.size,
        shape=SIZES[args.size],
        repeats=args.repeats,
        warmup=bm.WARMUP_STEPS,
        models=args.models,
        configs=args.configs,
        quick=args.quick,
        in_process=args.quick,
        grad_tolerance=bm.GRAD_TOLERANCE,
        checkpointed=args.checkpointed,
    )
    return dict(schema_version=1, environment=br.environment(THREADS), settings=settings, rows=br.add_ratios(rows))


def write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        br.write_json(args.json, result)
    if args.markdown:
        br.write_markdown(args.markdown, result)
    if args.plot and not br.write_plot(args.plot, result["rows"]):
        print("plot skipped (matplotlib not installed, or no successful row)", file=sys.stderr)
    print(br.markdown_table(result["rows"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.quick:
        runner = in_process_runner(args.size, args.repeats, args.checkpointed)
    else:
        runner = subprocess_runner(args.size, args.repeats, args.timeout, args.shared_cache, args.checkpointed)
    done: list[dict] = []

    def on_row(row: dict) -> None:  # the JSON so far after every row: a long run stopped midway keeps its rows
        log_row(row)
        done.append(row)
        if args.json:
            br.write_json(args.json, build_result(args, done))

    reused = None
    if args.reuse_pytorch:
        earlier = json.loads(Path(args.reuse_pytorch).read_text())
        reused = [r for r in earlier["rows"] if r.get("size") == args.size]
    rows = run_all(plan(args.models, args.configs), runner, args.size, on_row=on_row, reused=reused)
    write_outputs(args, build_result(args, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
