"""The third-party zoo: every setting of PyTorch and fxremat on transformers, timm, diffusers and torchvision models,
with the loss inside the compiled module and outside it (issue #56).

    python benchmarks/zoo.py [--models NAME ...] [--configs NAME ...] [--sides inside outside] [--size act|tiny]
                             [--json PATH] [--repeats N] [--timeout S] [--in-process] [--retry-errors]

Each (model, loss side, configuration) runs in a fresh process with an empty Inductor cache and one thread:
measured step peak (the CPU profiler's memory events, above the bytes live at the step's start), fxremat's
simulated peak beside it, the step time (median of ``--repeats`` after warm-up), saved bytes, and the gradients of
the first compiled step against an fp64 eager copy (``grad_rule``: wrong only where eager fp32 is not as far off).
Resumable: rows already in ``--json`` (default ``benchmarks/results/zoo.json``) are skipped, errors too unless
``--retry-errors``; the file is rewritten after every row.  Not run by CI, except one model at ``--size tiny``
(``tests/benchmarks/test_zoo.py``).  Models: ``zoo_models.MODELS`` (those whose library is missing give an error row
that says which; the ``zoo`` extra lists them).  The table is printed: per model and loss side, each setting's
measured peak (simulated), and the checks the issue judges (``zoo_checks``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_measure as bm  # noqa: E402
import grad_rule  # noqa: E402
import zoo_models  # noqa: E402
from zoo_checks import CONFIGS  # noqa: E402

ROW_MARKER = "FXREMAT_ZOO_ROW "
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "zoo.json"
KEY_FIELDS = ("model", "size", "loss_side", "config")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(zoo_models.MODELS), choices=zoo_models.MODELS)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--sides", nargs="+", default=list(zoo_models.LOSS_SIDES), choices=zoo_models.LOSS_SIDES)
    parser.add_argument("--size", default="act", choices=list(zoo_models.SIZES))
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="results file; rows already there are skipped")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps after warm-up; the median is kept")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one worker process may take")
    parser.add_argument("--in-process", action="store_true", help="no worker processes (tests; compile times shared)")
    parser.add_argument("--retry-errors", action="store_true", help="run again the rows that ended in an error")
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "SIZE", "SIDE", "CONFIG"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---- one row, in this process ----------------------------------------------------------------------------------


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def reference_grads(work) -> tuple[dict, dict]:
    """(eager fp32 gradients, eager fp64 gradients) of one step, on copies of the model."""
    import grad_check  # its workload copy casts floating inputs to fp64 and keeps integer ones

    out = []
    for double in (False, True):
        twin = grad_check.copy_workload(work, double=double)
        twin.loss(twin.forward(twin.model)).backward()
        out.append(_grads(twin.model))
    return out[0], out[1]


def gradient_verdict(grads: dict, grads32: dict, grads64: dict) -> dict[str, Any]:
    errors, near_zero = grad_rule.relative_errors(grads, grads64)
    eager_errors, _ = grad_rule.relative_errors(grads32, grads64)
    verdict = grad_rule.judge(errors, eager_errors)
    verdict["near_zero_grad_params"] = near_zero
    verdict["grads_right"] = verdict["wrong_params"] == 0
    return verdict


def measure(name: str, size: str, side: str, config: str, repeats: int) -> dict[str, Any]:
    """Build, compile, check and time one row; plain JSON values."""
    import torch

    work = zoo_models.build(name, size, side)
    row: dict[str, Any] = dict(model=name, size=size, loss_side=side, config=config, model_info=work.info)
    row["threads"] = torch.get_num_threads()
    graphs_before = bm.dynamo_graph_count()
    grads32, grads64 = reference_grads(work)
    backend, context = bm.make_backend(config, None)
    compiled = torch.compile(work.model, backend=backend)
    row.update(bm.first_step(compiled, work, "cpu", context))
    row["gradients"] = gradient_verdict(_grads(work.model), grads32, grads64)
    for _ in range(bm.WARMUP_STEPS):
        bm.timed_step(compiled, work, "cpu")
    work.model.zero_grad(set_to_none=True)
    row["peak_bytes"], row["peak_method"] = bm.step_peak_bytes(lambda: bm.train_step(compiled, work), "cpu")
    row["param_grad_bytes"] = sum(p.numel() * p.element_size() for p in work.model.parameters() if p.requires_grad)
    times = [bm.timed_step(compiled, work, "cpu") * 1e3 for _ in range(repeats)]
    row.update(step_ms=statistics.median(times), step_times_ms=times)
    row["graphs"] = bm.dynamo_graph_count() - graphs_before
    row.update(bm.fxremat_facts(backend))
    row.update(bm.simulated_facts(backend, row["peak_bytes"], row["graphs"]))
    row["error"] = None
    return row


def measure_or_error(name: str, size: str, side: str, config: str, repeats: int) -> dict[str, Any]:
    try:
        return measure(name, size, side, config, repeats)
    except Exception as exc:  # noqa: BLE001 - one row failing (a missing library, a compile error) is a row
        return error_row((name, size, side, config), f"{type(exc).__name__}: {exc}", traceback.format_exc())


def error_row(key: tuple, error: str, detail: str = "") -> dict[str, Any]:
    return dict(zip(KEY_FIELDS, key), error=error[:2000], detail=detail[-4000:])


# ---- the plan, the workers, the file ---------------------------------------------------------------------------


def row_key(row: dict) -> tuple:
    return tuple(row.get(field) for field in KEY_FIELDS)


def pending(args: argparse.Namespace, done: list[dict]) -> list[tuple]:
    """The rows still to run, in order: per model and loss side, PyTorch's settings first."""
    kept = {row_key(r) for r in done if r.get("error") is None or not args.retry_errors}
    wanted = [(m, args.size, s, c) for m in args.models for s in args.sides for c in args.configs]
    return [key for key in wanted if key not in kept]


def run_worker(key: tuple, repeats: int, timeout: float) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="fxremat-zoo-inductor-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", *key, "--repeats", str(repeats)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return error_row(key, f"worker timed out after {timeout:.0f} s")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = [line[len(ROW_MARKER) :] for line in proc.stdout.splitlines() if line.startswith(ROW_MARKER)]
    if not lines:
        return error_row(key, f"worker exited with {proc.returncode} and no result", proc.stderr)
    row = json.loads(lines[-1])
    row["worker_s"] = time.perf_counter() - start
    return row


def run_in_process(key: tuple, repeats: int) -> dict[str, Any]:
    import torch

    from fxremat_passes import _torch_private as tp

    torch._dynamo.reset()
    with tp.fresh_inductor_cache():
        return measure_or_error(*key, repeats)


def environment() -> dict[str, Any]:
    import platform

    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return dict(date=time.strftime("%Y-%m-%d %H:%M", time.gmtime()), torch=torch.__version__, git_commit=commit,
                cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count(), threads=1,
                load_avg_1min=os.getloadavg()[0])


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else dict(benchmark="zoo", rows=[])


def save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    result["rows"].sort(key=lambda r: tuple(str(v) for v in row_key(r)))
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.json)
    result = load(path)
    for key in pending(args, result["rows"]):
        print("zoo:", *key, flush=True)
        env = environment()  # per row: the load it ran under
        row = run_in_process(key, args.repeats) if args.in_process else run_worker(key, args.repeats, args.timeout)
        row["environment"] = env
        result["environment"] = dict(env, command_line=sys.argv)
        result["rows"] = [r for r in result["rows"] if row_key(r) != key] + [row]
        save(path, result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        import torch

        torch.set_num_threads(1)
        row = measure_or_error(*args.worker, args.repeats)
        print(ROW_MARKER + json.dumps(row, default=str), flush=True)
        return 0
    import zoo_checks

    result = run(args)
    print(zoo_checks.table(result["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
