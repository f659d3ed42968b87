"""The GPU check and recording: one command, run once on a GPU machine, that measures and records everything the
CPU replay (``gpu_replay.py``) needs (issue #57).

    python benchmarks/gpu_check.py [MODEL ...] [--out DIR] [--record DIR] [--steps 20] [--repeats 3]
                                   [--configs NAME ...] [--dry-run]

Models (random weights, bf16, nothing downloaded; all three by default):
  - ``gpt2``: transformers' GPT-2 124M (12 layers, n_embd 768, vocab 50257), batch 8 x 1024;
  - ``llama``: a Llama-style model (8 layers, dim 2048, 16 heads, 4 key-value heads, SwiGLU 5632, vocab 32000),
    batch 4 x 2048;
  - ``resnet18``: a conv net, torchvision's ResNet-18 layout (``conv_models.ResNet18``), 64 images of 224 x 224.
Configurations: the transformers under Inductor's default partitioner, PyTorch's ``activation_memory_budget=0.5``,
fxremat's default and fxremat's ``peak_budget=0.5``; the conv net under Inductor's default and fxremat's default.
PyTorch's partitioner runs as ``fxremat.recording.RecordedPyTorchPartitioner`` (the function and arguments
``compile_fx`` uses by default), so that its joint graph is recorded too.

Per model, in one process with a fresh Inductor cache: the reference gradients (eager in fp32 for a bf16 run,
fp64 for the dry run's fp32) and eager's own error against them; then each configuration compiled on its own
model (same weights) inside ``fxremat.recording.recording()``, its first step's gradients judged against the
reference (``grad_rule``: wrong only beyond both 1e-3 and 10x eager's own error); the step's peak
(``torch.cuda.max_memory_allocated`` above the bytes live at its start, gradients set to None first) with the
allocator's history of that step; then the steps timed by CUDA events, alternating: ``--repeats`` repeats of
``--steps`` rounds, one step of each configuration per round, the first configuration rotating, after 3
warm-up rounds; per configuration the median of each repeat, their median and the spread.

Written: ``--out`` (default ``benchmarks/results/gpu_check``) ``gpu_check.json`` and ``gpu_check.md`` (the table
is printed too); ``--record`` (default ``benchmarks/results/gpu_recordings``) the recording
(``gpu_recording.py``: per model and configuration the measurements, the joint graphs as fxremat or PyTorch's
partitioner received them, the plans, fxremat's reports, Inductor's kernels in order, the allocation timeline).
``--dry-run``: tiny shapes, fp32, this machine's CPU (CI runs it; the same code path; the peak from the CPU
profiler's memory events, no allocation history), into a temporary folder unless ``--out``/``--record`` say.

Time bound (<= 6 minutes on one H100, compiles included), estimated from the first GPU run of this check (H100,
torch 2.11, benchmarks/results/gpu_check_<model>/): one compile per configuration took 15-31 s (GPT-2: 22, 24, 18,
27 s; Llama: 23, 24, 16, 31 s); each model's whole run, 123 and 139 s, also paid a process start, a small fp32
compile for its gradients and a calibration (~25 s together), which this run pays once or not at all.  Here, per
model: its compiles (~92 s per transformer), 3 warm-up and 3 x 20 alternating steps per configuration (GPT-2 ~27
ms, Llama ~55 ms a step: ~7 and ~14 s), the reference steps, copies of the built model, the recording's simulated
peaks and files (~6 s): about 105 s (GPT-2) and 125 s (Llama); the conv net's two compiles are not measured on a GPU
yet and are budgeted at 40 s each, 100 s with its steps; start-up and calibration ~20 s: about 350 s in all.
``--time-limit`` (default 360 s) skips a model whose budget (``MODEL_SECONDS``) would pass it, so that slow compiles
cost the conv net's rows, never the transformers' (they run first).

On the project's lent GPU machine: ``bash benchmarks/gpu_run.sh`` (fxremat from the checkout, no install; it runs
this and packs the output into one file of ``$OUT``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report  # noqa: E402
import gpu_recording  # noqa: E402
import grad_rule  # noqa: E402

TRANSFORMER_CONFIGS = ("pytorch_default", "pytorch_budget_0.5", "fxremat_default", "fxremat_peak_0.5")
CONV_CONFIGS = ("pytorch_default", "fxremat_default")
CONFIGS = TRANSFORMER_CONFIGS
MODELS = ("gpt2", "llama", "resnet18")
MODEL_CONFIGS = {"gpt2": TRANSFORMER_CONFIGS, "llama": TRANSFORMER_CONFIGS, "resnet18": CONV_CONFIGS}
WARMUP_ROUNDS = 3
# Each model's budgeted seconds on one H100 (the docstring's estimate): a model whose budget no longer fits within
# ``--time-limit`` is skipped with a row that says so, so that the run stays within the device time it is given.
MODEL_SECONDS = {"gpt2": 105, "llama": 125, "resnet18": 100}
TIME_LIMIT = 360
RECOMPILE_LIMIT = 64  # one Dynamo cache entry per configuration per code object

# name -> shape (the transformers in bench_models' keys); the dry-run shape keeps each model's structure (GQA for
# llama, every ResNet stage) at a size a CPU compiles in seconds.
SHAPES: dict[str, dict] = {
    "gpt2": dict(layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=1024),
    "llama": dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, batch=4, seq=2048),
    "resnet18": dict(widths=[64, 128, 256, 512], classes=1000, batch=64, image=224),
}
DRY_SHAPES: dict[str, dict] = {
    "gpt2": dict(layers=2, hidden=64, heads=4, vocab=256, batch=1, seq=32),
    "llama": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=256, batch=1, seq=32),
    "resnet18": dict(widths=[8, 16, 16, 16], classes=10, batch=2, image=32),
}


def _built_on_cpu(model_name: str, shape: dict):
    """(model in fp32 on the CPU, its batch tensors, items per step), built once per model and shape and kept
    (``_BUILT``): each configuration starts from a copy, the random initialisation of a large model being slow."""
    key = (model_name, json.dumps(shape, sort_keys=True))
    if key not in _BUILT:
        _BUILT.clear()  # one model's copy at a time
        if model_name == "resnet18":
            import conv_models

            torch.manual_seed(0)
            net = conv_models.ResNet18(widths=tuple(shape["widths"]), classes=shape["classes"])
            images = torch.randn(shape["batch"], 3, shape["image"], shape["image"])
            labels = torch.randint(0, shape["classes"], (shape["batch"],))
            _BUILT[key] = (net, dict(images=images, labels=labels), shape["batch"])
        else:
            import bench_models

            work = bench_models.hf_workload(model_name, shape)
            _BUILT[key] = (work.model, dict(input_ids=work.kwargs["input_ids"]), work.kwargs["input_ids"].numel())
    return _BUILT[key]


_BUILT: dict = {}


def build(model_name: str, shape: dict, dtype: torch.dtype, device: str):
    """(model, loss: model -> scalar, items per step): the same weights and batch in every build."""
    import copy

    cpu_model, batch, items = _built_on_cpu(model_name, shape)
    model = copy.deepcopy(cpu_model).to(device=device, dtype=dtype)
    if model_name == "resnet18":
        images, labels = batch["images"].to(device=device, dtype=dtype), batch["labels"].to(device)
        return model, lambda m: torch.nn.functional.cross_entropy(m(images), labels), items
    ids = batch["input_ids"].to(device)
    return model, lambda m: m(input_ids=ids, labels=ids).loss, items


def make_backend(config: str):
    """The backend of a configuration: PyTorch's partitioner recorded (``RecordedPyTorchPartitioner``), or
    fxremat's (its production settings: no comparison run for the report)."""
    import fxremat
    from fxremat import recording

    if config == "pytorch_default":
        return recording.pytorch_backend(1.0)
    if config == "pytorch_budget_0.5":
        return recording.pytorch_backend(0.5)
    if config == "fxremat_default":
        return fxremat.backend(compare_default=False)
    if config == "fxremat_peak_0.5":
        return fxremat.backend(compare_default=False, peak_budget=0.5)
    raise ValueError(f"unknown configuration {config!r}; one of {TRANSFORMER_CONFIGS}")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def reference(model_name: str, shape: dict, dtype: torch.dtype, device: str) -> dict:
    """The reference gradients (eager, a wider dtype) and eager's own error against them at ``dtype``."""
    wide = torch.float64 if dtype == torch.float32 else torch.float32
    model, loss, _ = build(model_name, shape, wide, device)
    expected_loss = loss(model)
    expected_loss.backward()
    expected = _grads(model)
    del model
    model, loss, _ = build(model_name, shape, dtype, device)
    eager_loss = loss(model)
    eager_loss.backward()
    eager_errors, _ = grad_rule.relative_errors(_grads(model), expected)
    return dict(grads=expected, loss=expected_loss.item(), eager_errors=eager_errors, dtype=str(wide))


def compile_config(model_name: str, config: str, shape: dict, dtype: torch.dtype, device: str, ref: dict) -> dict:
    """A fresh model compiled for ``config``, its first (compiling) step recorded: the entry holds the model, its
    step, the recording and the row so far (compile time, gradients)."""
    from bench_measure import dynamo_graph_count

    from fxremat import recording

    model, loss, items = build(model_name, shape, dtype, device)
    backend = make_backend(config)
    compiled = torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        loss(compiled).backward()

    graphs_before = dynamo_graph_count()
    _sync(device)
    began = time.perf_counter()
    with recording.recording() as recorder:
        model.zero_grad(set_to_none=True)
        first_loss = loss(compiled)
        first_loss.backward()
        _sync(device)
    row = dict(model=model_name, config=config, compile_s=time.perf_counter() - began)
    row["graphs"] = dynamo_graph_count() - graphs_before
    errors, near_zero = grad_rule.relative_errors(_grads(model), ref["grads"])
    row["gradients"] = dict(grad_rule.judge(errors, ref["eager_errors"]), near_zero=near_zero, reference=ref["dtype"])
    row["loss_error"] = grad_rule.loss_error(first_loss.item(), ref["loss"])
    return dict(model=model, step=step, backend=backend, recorder=recorder, items=items, row=row)


def measure_peak(entry: dict, device: str, record: bool) -> None:
    """The step's peak above its start (gradients None first), and on a GPU the allocator's history of that step."""
    from fxremat.measure import step_peak_bytes
    from fxremat_passes._torch_private import recording as tp_recording

    entry["model"].zero_grad(set_to_none=True)
    step = entry["step"]
    if device == "cuda" and record:
        with tp_recording.cuda_memory_history():
            peak, source = step_peak_bytes(step, device)
            snapshot = tp_recording.cuda_memory_snapshot()
        entry["allocations"] = gpu_recording.reduce_snapshot(snapshot, torch.cuda.current_device())
    else:
        peak, source = step_peak_bytes(step, device)
        entry["allocations"] = None
    entry["model"].zero_grad(set_to_none=True)
    entry["row"].update(peak_bytes=peak, peak_source=source)


def time_alternating(entries: dict[str, dict], steps: int, repeats: int, device: str) -> None:
    """Warm-up rounds, then ``repeats`` repeats of ``steps`` rounds, one step of each configuration per round, the
    first rotating (``step_interleaved.round_robin``; Python's collector paused in each repeat)."""
    from step_interleaved import collector_paused, round_robin

    from fxremat.measure import device_seconds

    ready = list(entries)
    for _, config in round_robin(ready, WARMUP_ROUNDS):
        entries[config]["step"]()
    times: dict[str, list[list[float]]] = {config: [] for config in ready}
    for _ in range(repeats):
        for config in ready:
            times[config].append([])
        with collector_paused():
            for _, config in round_robin(ready, steps):
                times[config][-1].append(device_seconds(entries[config]["step"], device))
    for config in ready:
        row, per_repeat = entries[config]["row"], [statistics.median(t) for t in times[config]]
        median = statistics.median(per_repeat)
        row.update(step_s=median, step_s_per_repeat=per_repeat, step_s_spread=[min(per_repeat), max(per_repeat)])
        row.update(step_s_all=[min(min(t) for t in times[config]), max(max(t) for t in times[config])])
        row["items_per_s"] = entries[config]["items"] / median if median else None
        entries[config]["model"].zero_grad(set_to_none=True)


def finish_config(entry: dict, folder: Path | None) -> dict:
    """The row with fxremat's simulated peak beside the measured one, and the configuration's recording written."""
    import bench_measure

    row, backend = entry["row"], entry["backend"]
    row.update(bench_measure.simulated_facts(backend, row["peak_bytes"], row["graphs"]))
    row.update(bench_measure.fxremat_facts(backend))
    recorded = entry["recorder"].to_data()  # the reports' deferred fields computed here, after the timing
    row["recorded_graphs"] = len(recorded["graphs"])
    row["unrecorded"] = [g["unrecorded"] for g in recorded["graphs"] if g.get("unrecorded")]
    if folder is not None:
        measured = {k: v for k, v in row.items() if k not in ("model", "config")}
        measured["allocations"] = entry.get("allocations")
        path = gpu_recording.write_config(folder, row["model"], row["config"], recorded, measured)
        row["recording"] = path.relative_to(folder).as_posix()
    return row


def run_model(model_name: str, configs: list[str], dry_run: bool, steps: int, repeats: int, folder) -> list[dict]:
    device = "cpu" if dry_run else "cuda"
    shape = DRY_SHAPES[model_name] if dry_run else SHAPES[model_name]
    dtype = torch.float32 if dry_run else torch.bfloat16
    ref = reference(model_name, shape, dtype, device)
    entries, rows = {}, {}
    for config in configs:
        try:
            entries[config] = compile_config(model_name, config, shape, dtype, device, ref)
            measure_peak(entries[config], device, folder is not None)
        except Exception as error:  # noqa: BLE001 - one failing configuration must not cost the others their rows
            entries.pop(config, None)
            rows[config] = dict(model=model_name, config=config, error=f"{type(error).__name__}: {error}"[:300])
            print(json.dumps(rows[config]), flush=True)
    time_alternating(entries, steps, repeats, device)
    for config, entry in entries.items():
        rows[config] = finish_config(entry, folder)
        print(json.dumps({k: v for k, v in rows[config].items() if k != "gradients"}, default=str), flush=True)
    del entries
    _BUILT.clear()
    _release(device)
    return [rows[c] for c in configs]


def _release(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _mib(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:,.1f}"


def markdown(record: dict) -> str:
    """The run as a Markdown table (the printed table and the .md file)."""
    lines = [
        f"GPU check, {record['device_name']}, torch {record['torch']}",
        "",
        "| model | configuration | compile s | peak MiB | simulated MiB (error) | step ms (repeats' medians) | "
        "items/s | gradients |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['config']} | failed: {row['error']} | | | | | |")
            continue
        sim = _mib(row.get("simulated_peak_bytes"))
        if sim and row.get("sim_error") is not None:
            sim += f" ({row['sim_error']:+.1%})"
        reps = " / ".join(f"{t * 1e3:.1f}" for t in row["step_s_per_repeat"])
        grads = row["gradients"]
        verdict = "equal" if grads["wrong_params"] == 0 else f"WRONG ({grads['wrong_params']})"
        lines.append(
            f"| {row['model']} | {row['config']} | {row['compile_s']:.1f} | {_mib(row['peak_bytes'])} | {sim} | "
            f"{row['step_s'] * 1e3:.1f} ({reps}) | {row['items_per_s']:,.0f} | {verdict} "
            f"({grads['worst_error']:.1e}) |"
        )
    lines += [
        "",
        f"Total {record['seconds']:.0f} s.  Steps: the median of {record['repeats']} repeats' medians of "
        f"{record['steps']} alternating steps.  Gradients: each configuration's first step against eager in "
        "a wider dtype, wrong only beyond both 1e-3 and 10x eager's own error (worst relative error shown).",
        "Compile s: to the end of the first step, the configurations in turn in one process (the first pays the",
        "process's cold start): not a compile-time comparison (benchmarks/compile_time.py runs each in its own).",
    ]
    return "\n".join(lines) + "\n"


def run_check(models: list[str], dry_run: bool, steps: int, repeats: int, configs, folder, time_limit=None) -> dict:
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py: no CUDA device here; use --dry-run to check the script on the CPU")
    from fxremat_passes import _torch_private as tp

    began = time.perf_counter()
    rows = []
    with tp.fresh_inductor_cache(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        for name in models:
            chosen = [c for c in MODEL_CONFIGS[name] if configs is None or c in configs]
            spent = time.perf_counter() - began
            if not dry_run and time_limit is not None and spent + MODEL_SECONDS[name] > time_limit:
                note = f"skipped: {spent:.0f} s spent, {MODEL_SECONDS[name]} s budgeted, --time-limit {time_limit}"
                rows += [dict(model=name, config=c, error=note) for c in chosen]
                continue
            try:
                rows += run_model(name, chosen, dry_run, steps, repeats, folder)
            except Exception as error:  # noqa: BLE001 - one failing model (its reference, say) must not cost the others
                rows += [dict(model=name, config=c, error=f"{type(error).__name__}: {error}"[:300]) for c in chosen]
                _BUILT.clear()
                _release("cpu" if dry_run else "cuda")
    device_name = "CPU (dry run)" if dry_run else torch.cuda.get_device_name()
    calibrated = None
    if not dry_run and any("error" not in row for row in rows):  # the device="calibrated" profile (calibrate.py)
        from fxremat.calibrate import measure

        profile = measure(torch.device("cuda"))
        calibrated = dict(matmul_flops=profile.peak_flops(None), copy_bytes_per_s=profile.mem_bandwidth)
    shapes = {name: (DRY_SHAPES if dry_run else SHAPES)[name] for name in models}
    return dict(
        environment=bench_report.environment(torch.get_num_threads()),
        device_name=device_name,
        torch=torch.__version__,
        dry_run=dry_run,
        shapes=shapes,
        dtype="float32" if dry_run else "bfloat16",
        steps=steps,
        repeats=repeats,
        rows=rows,
        calibrated=calibrated,
        seconds=time.perf_counter() - began,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=[], metavar="MODEL", help=f"of {' '.join(MODELS)} (default: all)")
    parser.add_argument("--out", default=None, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--record", default=None, help="folder for the recording (gpu_recording.py)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration and repeat (>= 20)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats (>= 3)")
    parser.add_argument("--configs", nargs="+", default=None, choices=TRANSFORMER_CONFIGS)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, fp32, CPU: checks the script")
    parser.add_argument(
        "--time-limit", type=float, default=TIME_LIMIT, help="seconds: a model whose budget would pass it is skipped"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {' '.join(MODELS)}")
    models = [m for m in MODELS if m in (args.models or MODELS)]
    steps, repeats = (min(args.steps, 2), min(args.repeats, 2)) if args.dry_run else (args.steps, args.repeats)
    results = Path(__file__).resolve().parent / "results"
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_dry_")) if args.dry_run else None
    out = Path(args.out or (scratch / "out" if scratch else results / "gpu_check"))
    folder = Path(args.record or (scratch / "recording" if scratch else results / "gpu_recordings"))
    record = run_check(models, args.dry_run, steps, repeats, args.configs, folder, args.time_limit)
    out.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))
    (folder / gpu_recording.INDEX).write_text(json.dumps(record, indent=1, default=str))
    table = markdown(record)
    (out / "gpu_check.md").write_text(table)
    print(table)
    print(f"written: {out}, recording {folder} ({gpu_recording.folder_bytes(folder):,} bytes)")
    failed = [row for row in record["rows"] if "error" in row or row["gradients"]["wrong_params"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
