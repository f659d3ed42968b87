"""Gradient check under real Inductor: does a compiled training step give the gradients eager gives?

    python benchmarks/grad_check.py [--models NAMES] [--settings NAMES] [--out PATH] [--timeout S] [--list]

One training step of each model, compiled with Inductor in its default configuration and each partitioner
setting, against an fp64 eager copy of the model; the rule that calls a parameter wrong is in ``grad_rule.py``.
Each (model, setting) runs in a fresh process (this script in its hidden ``--worker`` mode, printing one JSON line)
with an empty Inductor cache of its own, on one thread.  The fxremat settings gate (the exit status is 1 when one
of them has a wrong parameter, a wrong loss or an error); ``pytorch_default`` is reported beside them for
comparison.  See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this script

import bench_report as br  # noqa: E402
import grad_rule  # noqa: E402
import torch  # noqa: E402
from bench_measure import dynamo_graph_count, fxremat_facts, has_dropout  # noqa: E402
from bench_models import Workload, build_workload  # noqa: E402
from conv_models import CONV_MODELS, build_conv_workload  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fxremat.measure import measure_saved  # noqa: E402

ROW_MARKER = "FXREMAT_GRAD_ROW "  # the worker's result line; everything else it prints is noise to us
THREADS = 1
SIZE = "small"  # bench_models' size for its models
BENCH_MODELS = ("mlp", "block_sdpa", "stack", "convnet", "gpt2", "llama", "bert", "t5", "vit", "mixtral")
MODELS = BENCH_MODELS + CONV_MODELS
# setting -> fxremat.backend options (None: PyTorch's own partitioner, backend="inductor")
SETTINGS: dict[str, dict[str, float | int] | None] = {
    "fxremat_default": {},
    "fxremat_budget_1.0": dict(memory_budget=1.0),
    "fxremat_budget_0.5": dict(memory_budget=0.5),
    "fxremat_budget_0.2": dict(memory_budget=0.2),
    "fxremat_budget_0.0": dict(memory_budget=0.0),
    "fxremat_peak_0.5": dict(peak_budget=0.5),
    "fxremat_peak_0.0": dict(peak_budget=0.0),
    # the loss region chunked without recomputing the head (the returned-logits form on the transformers models)
    "fxremat_loss_chunks_4": dict(loss_chunks=4),
    "pytorch_default": None,
}
BASELINE = "pytorch_default"
REFERENCE_SETTINGS = (BASELINE,)  # reported beside the others; never gates


def gates(setting: str) -> bool:
    return setting not in REFERENCE_SETTINGS


# ---- command line ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME", help="default: all (see --list)")
    parser.add_argument("--settings", nargs="+", default=None, metavar="NAME", help="default: all (see --list)")
    parser.add_argument("--out", default=None, metavar="PATH", help="JSON file, rewritten after every run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one worker process")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at a time (one thread each)")
    parser.add_argument("--list", action="store_true", help="list the models and settings, and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = args.models or list(MODELS)
    args.settings = args.settings or list(SETTINGS)
    for kind, names, known in (("model", args.models, MODELS), ("setting", args.settings, SETTINGS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown {kind} {' '.join(unknown)}; choose from {' '.join(known)}")
    return args


def listing() -> str:
    models = [(m, f"bench_models.py, size {SIZE}") for m in BENCH_MODELS]
    models += [(m, "conv_models.py" + (" (diffusers)" if m.startswith("unet") else "")) for m in CONV_MODELS]
    settings = [(s, "backend='inductor'" if o is None else f"fxremat.backend({_options_text(o)})",
                 "yes" if gates(s) else "no (reported beside)") for s, o in SETTINGS.items()]
    return (tabulate(models, headers=("model", "from")) + "\n\n"
            + tabulate(settings, headers=("setting", "compiled with", "gates")) + "\n")


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in {**options, "compare_default": False}.items())


# ---- worker: one (model, setting) in this process --------------------------------------------------------------


def build(name: str):
    return build_conv_workload(name) if name in CONV_MODELS else build_workload(name, SIZE)


def _to_double(value: Any) -> Any:
    # integer inputs (token ids, labels, timesteps) stay integer: only floating tensors become fp64
    if hasattr(value, "is_floating_point") and value.is_floating_point():
        return value.double()
    return value


def copy_workload(work, double: bool = False):
    """An independent copy of the workload (a deep copy of the model, so BatchNorm's running statistics and every
    parameter start where the original does); ``double``: the model and its floating inputs in fp64."""
    model = copy.deepcopy(work.model)
    if not double:
        return Workload(model, args=work.args, kwargs=dict(work.kwargs), loss=work.loss, info=work.info)
    cast = _to_double
    return Workload(model.to(torch.float64), args=tuple(cast(a) for a in work.args),
                    kwargs={k: cast(v) for k, v in work.kwargs.items()}, loss=work.loss, info=work.info)


def train_step(work, model) -> tuple[float, dict]:
    """(loss, gradient per parameter) of one forward + backward of ``model`` on the workload's batch."""
    work.model.zero_grad(set_to_none=True)
    loss = work.loss(work.forward(model))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in work.model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def compiled_step(work, compiled):
    """``train_step`` of the compiled model, its forward under saved-tensor hooks: (loss, gradients, what autograd
    kept for backward: distinct storages, parameters, buffers and inputs excluded, as ``CutReport.saved_bytes``)."""
    model = work.model
    model.zero_grad(set_to_none=True)
    tensors = [*work.args, *work.kwargs.values()]
    exclude = [*model.parameters(), *model.buffers(), *(t for t in tensors if isinstance(t, torch.Tensor))]
    out, saved = measure_saved(lambda: work.forward(compiled), exclude)
    loss = work.loss(out)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, saved


def dropout_active(work) -> bool:
    """Dropout with p > 0, or any other randomness: two eager forwards under different seeds disagree.  The fp64
    rule cannot judge such a model (each step draws its own mask); it is left to its own tests."""
    if has_dropout(work.model):
        return True
    probe = copy_workload(work)
    losses = []
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            losses.append(probe.loss(probe.forward(probe.model)).item())
    return losses[0] != losses[1]


def make_backend(setting: str):
    options = SETTINGS[setting]
    if options is None:
        return "inductor"
    import fxremat

    # compare_default=False: the production setting, and no second partition per graph for a report we never read
    return fxremat.backend(compare_default=False, **options)


def check(model_name: str, setting: str) -> dict[str, Any]:
    """One compiled training step against eager fp64 and eager fp32; a row of plain JSON values."""
    work = build(model_name)
    row: dict[str, Any] = dict(model=model_name, setting=setting, gates=gates(setting), model_info=work.info)
    reference, eager = copy_workload(work, double=True), copy_workload(work)  # before any step mutates state
    row["dropout"] = dropout_active(work)
    loss64, grads64 = train_step(reference, reference.model)
    loss32, grads32 = train_step(eager, eager.model)
    backend = make_backend(setting)
    graphs_before = dynamo_graph_count()
    start = time.perf_counter()
    loss, grads, saved = compiled_step(work, torch.compile(work.model, backend=backend))
    row["compile_step_s"] = time.perf_counter() - start
    row["saved_bytes"] = saved.nbytes
    row["graphs"] = dynamo_graph_count() - graphs_before
    row.update(fxremat_facts(backend))
    row.update(verdict(loss, grads, loss32, grads32, loss64, grads64, skip=row["dropout"]))
    row["status"], row["error"] = "ok", None
    return row


def verdict(loss, grads, loss32, grads32, loss64, grads64, skip: bool = False) -> dict[str, Any]:
    """The rule applied to one step's loss and gradients; with ``skip`` (dropout) only the figures, no verdict."""
    errors, near_zero = grad_rule.relative_errors(grads, grads64)
    eager_errors, _ = grad_rule.relative_errors(grads32, grads64)
    out = grad_rule.judge(errors, eager_errors)
    out.update(loss_error=grad_rule.loss_error(loss, loss64), eager_loss_error=grad_rule.loss_error(loss32, loss64),
               near_zero_grad_params=near_zero)
    out["loss_wrong"] = grad_rule.is_wrong(out["loss_error"], out["eager_loss_error"])
    if skip:
        out.update(wrong_params=None, wrong=[], loss_wrong=None)
    return out


def check_or_error(model_name: str, setting: str) -> dict[str, Any]:
    try:
        return check(model_name, setting)
    except Exception as exc:  # noqa: BLE001 - one model failing must never abort the check
        return error_row(model_name, setting, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def error_row(model_name: str, setting: str, error: str, detail: str = "") -> dict[str, Any]:
    return dict(model=model_name, setting=setting, gates=gates(setting), status="error", error=error[:2000],
                detail=detail[-4000:])


def worker_main(args: argparse.Namespace) -> int:
    torch.set_num_threads(THREADS)
    if len(args.models) != 1 or len(args.settings) != 1:
        raise SystemExit("--worker runs exactly one --models NAME and one --settings NAME")
    row = check_or_error(args.models[0], args.settings[0])
    print(ROW_MARKER + json.dumps(row, default=str), flush=True)
    return 0


# ---- orchestration ---------------------------------------------------------------------------------------------


def plan(models: list[str], settings: list[str]) -> list[tuple[str, str]]:
    """(model, setting) per model, settings in SETTINGS order: one model's rows come together."""
    return [(m, s) for m in models for s in SETTINGS if s in settings]


def parse_worker_output(stdout: str) -> dict | None:
    rows = [line[len(ROW_MARKER):] for line in stdout.splitlines() if line.startswith(ROW_MARKER)]
    return json.loads(rows[-1]) if rows else None


def run_worker(model: str, setting: str, timeout: float) -> dict[str, Any]:
    """One fresh process with an empty Inductor cache (deleted after), on one thread."""
    cache = tempfile.mkdtemp(prefix="fxremat-grad-inductor-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
           "OMP_NUM_THREADS": str(THREADS)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--models", model, "--settings", setting]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return error_row(model, setting, f"worker timed out after {timeout:.0f} s")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    row = parse_worker_output(proc.stdout)
    if row is None:
        return error_row(model, setting, f"worker exited with {proc.returncode} and no result", proc.stderr)
    row["worker_s"] = time.perf_counter() - start
    return row


def run_all(runs: list[tuple[str, str]], runner=run_worker, timeout: float = 1800.0, on_row=None,
            jobs: int = 1) -> list[dict]:
    """Every run, ``jobs`` worker processes at a time (each on one thread: a gradient check is not a timing, so
    runs may share the machine's cores); rows in the order of ``runs``."""
    rows: list[dict | None] = [None] * len(runs)
    lock = threading.Lock()

    def one(i: int) -> None:
        model, setting = runs[i]
        print(f"[{i + 1}/{len(runs)}] {model} / {setting} ...", file=sys.stderr, flush=True)
        try:
            row = runner(model, setting, timeout)
        except Exception as exc:  # noqa: BLE001 - one run failing must never abort the others
            row = error_row(model, setting, f"{type(exc).__name__}: {exc}")
        with lock:
            rows[i] = row
            print(f"    [{i + 1}] {model} / {setting}: {outcome(row)}", file=sys.stderr, flush=True)
            if on_row is not None:
                on_row([r for r in rows if r is not None])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, range(len(runs))))
    return [r for r in rows if r is not None]


# ---- the record's outputs --------------------------------------------------------------------------------------


def outcome(row: dict[str, Any]) -> str:
    """One line: what the run found, for the progress log."""
    if row.get("status") == "error":
        return "error: " + row["error"].splitlines()[0][:200]
    time_s = f"{row['compile_step_s']:.1f} s"
    if row.get("wrong_params") is None:
        return f"skipped (dropout: checked by its own tests), worst {_e(row.get('worst_error'))}, {time_s}"
    loss = ", LOSS WRONG" if row.get("loss_wrong") else ""
    return (f"{row['wrong_params']}/{row['params']} wrong{loss}, worst {_e(row['worst_error'])} "
            f"({row['worst_param']}), eager fp32 {_e(row['eager_worst_error'])}, {time_s}")


def failed(row: dict[str, Any]) -> bool:
    """Whether a gating row fails the check: an error, a wrong parameter or a wrong loss."""
    return row.get("gates", True) and (row.get("status") == "error" or bool(row.get("wrong_params"))
                                       or bool(row.get("loss_wrong")))


def _e(value) -> str:
    return "" if value is None else f"{value:.1e}"


HEADERS = ("model", "setting", "status", "wrong", "worst error", "worst param", "eager fp32", "loss error",
           "saved MiB", "compile+step s", "note")


def table_row(row: dict[str, Any]) -> list[str]:
    if row.get("status") == "error":
        return [row["model"], row["setting"], "error", "", "", "", "", "", "", "", row["error"].splitlines()[0][:80]]
    wrong = "skipped" if row.get("wrong_params") is None else f"{row['wrong_params']}/{row['params']}"
    return [row["model"], row["setting"], _status(row), wrong, _e(row["worst_error"]),
            row["worst_param"] or "", _e(row["eager_worst_error"]),
            _e(row["loss_error"]) + (" WRONG" if row.get("loss_wrong") else ""),
            _mib(row.get("saved_bytes")), f"{row['compile_step_s']:.1f}", note(row)]


def _mib(nbytes) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:.2f}"


def _status(row: dict[str, Any]) -> str:
    """FAIL: a gating row's wrong parameter or loss; "wrong": the same in a row that does not gate."""
    if not (row.get("wrong_params") or row.get("loss_wrong")):
        return "ok"
    return "FAIL" if row["gates"] else "wrong"


def note(row: dict[str, Any]) -> str:
    notes = [] if row["gates"] else ["not gating"]
    if row.get("dropout"):
        notes.append("dropout: checked by its own tests")
    notes += br.compile_notes(row)
    if row.get("also_wrong_in_pytorch_default"):
        notes.append(f"{row['also_wrong_in_pytorch_default']} also wrong under {BASELINE}")
    return "; ".join(notes)


def cross_reference(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each gating row with wrong parameters, with ``also_wrong_in_pytorch_default``: how many of them PyTorch's
    own partitioner gets wrong too on the same model (None without that row).  Wrong under both, the mistake is
    more likely Inductor's than the partitioner's (unet_resnet on torch 2.13's CPU Inductor); the row still gates."""
    base = {r["model"]: {w["name"] for w in r["wrong"]} for r in rows
            if r["setting"] == BASELINE and r.get("status") == "ok" and r.get("wrong_params") is not None}
    out = []
    for row in rows:
        row = dict(row)
        if row.get("gates") and row.get("wrong"):
            names = base.get(row["model"])
            shared = None if names is None else sum(w["name"] in names for w in row["wrong"])
            row["also_wrong_in_pytorch_default"] = shared
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    return tabulate([table_row(r) for r in rows], headers=HEADERS, disable_numparse=True)


def summary(rows: list[dict[str, Any]]) -> str:
    gating = [r for r in rows if r.get("gates", True)]
    bad = [f"{r['model']}/{r['setting']}" for r in gating if failed(r)]
    skipped = sum(1 for r in gating if r.get("status") == "ok" and r.get("wrong_params") is None)
    text = f"{len(gating)} gating runs: {len(gating) - len(bad) - skipped} ok, {skipped} skipped (dropout)"
    return text + (f", {len(bad)} FAILED: {' '.join(bad)}" if bad else "")


def build_result(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    settings = dict(models=args.models, settings=args.settings, size=SIZE, tolerance=grad_rule.TOLERANCE,
                    eager_factor=grad_rule.EAGER_FACTOR, near_zero_grad=grad_rule.NEAR_ZERO_GRAD,
                    options={s: SETTINGS[s] for s in args.settings}, gating=[s for s in args.settings if gates(s)])
    return dict(schema_version=1, environment=br.environment(THREADS), settings=settings, rows=cross_reference(rows))


def write_json(path: str, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(listing(), end="")
        return 0
    if args.worker:
        return worker_main(args)
    save = (lambda rows: write_json(args.out, build_result(args, rows))) if args.out else None
    rows = cross_reference(run_all(plan(args.models, args.settings), timeout=args.timeout, on_row=save, jobs=args.jobs))
    print(table(rows))
    print(summary(rows))
    return 1 if any(failed(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
