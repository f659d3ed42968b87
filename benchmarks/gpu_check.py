"""The GPU check (issue #17): one command per model, run once on the first GPU machine this project is lent.

    python benchmarks/gpu_check.py gpt2|llama [--out DIR] [--steps 20] [--configs NAME ...] [--dry-run]

Models (transformers, random weights, bf16; no download):
  - ``gpt2``: the 124M configuration (12 layers, n_embd 768, 12 heads, vocab 50257), batch 8, seq 1024;
  - ``llama``: a Llama-style model of 8 layers, dim 2048, 16 heads, 4 key-value heads (grouped-query attention),
    SwiGLU width 5632, vocab 32000, batch 4, seq 2048.
Configurations: Inductor's default partitioner, PyTorch's ``activation_memory_budget=0.5``, fxremat's default and
fxremat's ``peak_budget=0.5``, one after the other in this process (Dynamo reset and the CUDA cache emptied
between them).  Per configuration: compile time (to the end of the first training step), the step's peak
(``torch.cuda.max_memory_allocated`` minus the bytes live at its start, gradients set to None before), the step
time (CUDA events, median of ``--steps`` after three warm-up steps), tokens/s, and for fxremat its simulated peak
beside the measured one.  Gradients: once per model, a small fp32 copy (the dry-run shape) compiled with fxremat's
default against eager on the same device (``grad_rule.relative_errors``; wrong above 1e-3).  JSON and Markdown go
to ``--out`` (default ``benchmarks/results/gpu_check_<model>``); the table is printed.

Time bound: each model is sized to finish in under 5 minutes on one H200, compiles included (four compiles of a
forward and a backward graph, each well under a minute with Inductor's defaults, plus 4 x 23 steps of at most
~0.5 s).  ``--dry-run``: tiny shapes, fp32, on this machine's CPU (CI runs it); the same code path otherwise.

Install on the GPU machine (no network there; torch, transformers, scipy, sympy, tabulate are preinstalled):
``pip install --no-deps --no-build-isolation .`` from a copy of this repository.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_report  # noqa: E402

CONFIGS = ("pytorch_default", "pytorch_budget_0.5", "fxremat_default", "fxremat_peak_0.5")
GRAD_CONFIG = "fxremat_default"
WARMUP_STEPS = 3
GRAD_TOLERANCE = 1e-3

# name -> shape in benchmarks/bench_models.py's keys (its builders make the transformers models); the dry-run shape
# keeps each model's structure (GQA for llama) at a size a CPU compiles in seconds, and is the fp32 copy the gradient
# check uses.
SHAPES: dict[str, dict[str, int]] = {
    "gpt2": dict(layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=1024),
    "llama": dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, batch=4, seq=2048),
}
DRY_SHAPES: dict[str, dict[str, int]] = {
    "gpt2": dict(layers=2, hidden=64, heads=4, vocab=256, batch=1, seq=32),
    "llama": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=256, batch=1, seq=32),
}


def build(model_name: str, shape: dict[str, int], dtype: torch.dtype, device: str):
    """(model, input ids): ``bench_models.hf_workload``, the same weights in every build, in ``dtype`` on
    ``device``."""
    import bench_models

    work = bench_models.hf_workload(model_name, shape).to(device)
    work.model.to(dtype=dtype)
    return work.model, work.kwargs["input_ids"]


def make_backend(config: str):
    """(backend, context to hold around the first step: PyTorch's budget is read when the graph is partitioned)."""
    import bench_measure

    return bench_measure.make_backend(config, None)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_seconds(step, device: str, steps: int) -> list[float]:
    """Seconds per step: CUDA events on a GPU (the host does not wait for each kernel), the wall clock on CPU."""
    from fxremat.measure import device_seconds

    return [device_seconds(step, device) for _ in range(steps)]


def measure_config(model_name: str, config: str, shape: dict, dtype: torch.dtype, device: str, steps: int) -> dict:
    """One configuration's row, measured from the outside (fxremat's report gives only its simulated peak)."""
    import bench_measure

    from fxremat.measure import step_peak_bytes

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the graph count is per configuration (``simulated_facts``)
    model, ids = build(model_name, shape, dtype, device)
    backend, context = make_backend(config)
    compiled = torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        compiled(input_ids=ids, labels=ids).loss.backward()

    _sync(device)
    began = time.perf_counter()
    with context():
        step()
    _sync(device)
    compile_s = time.perf_counter() - began
    for _ in range(WARMUP_STEPS - 1):
        step()
    model.zero_grad(set_to_none=True)
    peak, source = step_peak_bytes(lambda: compiled(input_ids=ids, labels=ids).loss.backward(), device)
    times = step_seconds(step, device, steps)
    median = statistics.median(times)
    row = dict(model=model_name, config=config, device=device, dtype=str(dtype).replace("torch.", ""))
    row.update(compile_s=compile_s, peak_bytes=peak, peak_source=source, step_s=median)
    row.update(step_s_spread=[min(times), max(times)], tokens_per_s=ids.numel() / median if median else None)
    row.update(bench_measure.simulated_facts(backend, peak, bench_measure.dynamo_graph_count()))
    row.update(bench_measure.fxremat_facts(backend))
    return row


def _release(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def gradient_check(model_name: str, device: str) -> dict:
    """fxremat's default on the small fp32 copy against eager on the same device: the largest relative error over
    the parameters (a gradient that is zero in exact arithmetic measured on the model's scale)."""
    import grad_rule

    shape = DRY_SHAPES[model_name]
    torch._dynamo.reset()
    eager, ids = build(model_name, shape, torch.float32, device)
    eager(input_ids=ids, labels=ids).loss.backward()
    expected = {k: p.grad for k, p in eager.named_parameters() if p.grad is not None}
    model, _ = build(model_name, shape, torch.float32, device)
    backend, context = make_backend(GRAD_CONFIG)
    with context():
        torch.compile(model, backend=backend)(input_ids=ids, labels=ids).loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters() if k in expected}
    errors, near_zero = grad_rule.relative_errors(grads, expected)
    worst = max(errors, key=errors.get)
    _release(device)
    return dict(
        config=GRAD_CONFIG,
        shape="dry-run shape, fp32",
        max_error=errors[worst],
        worst_parameter=worst,
        near_zero=near_zero,
        ok=errors[worst] <= GRAD_TOLERANCE,
    )


def _mib(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:,.1f}"


def markdown(record: dict) -> str:
    """The record as a Markdown table (the printed table and the .md file)."""
    lines = [
        f"GPU check, {record['model']} ({record['shape']}), {record['device_name']}, torch {record['torch']}",
        "",
        "| configuration | compile s | peak MiB | simulated MiB (error) | step ms (min-max) | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['config']} | failed: {row['error']} | | | | |")
            continue
        sim = _mib(row.get("simulated_peak_bytes"))
        if sim and row.get("sim_error") is not None:
            sim += f" ({row['sim_error']:+.1%})"
        low, high = row["step_s_spread"]
        lines.append(
            f"| {row['config']} | {row['compile_s']:.1f} | {_mib(row['peak_bytes'])} | {sim} | "
            f"{row['step_s'] * 1e3:.1f} ({low * 1e3:.1f}-{high * 1e3:.1f}) | {row['tokens_per_s']:,.0f} |"
        )
    grad = record["gradients"]
    verdict = "equal to eager" if grad["ok"] else "WRONG"
    lines += [
        "",
        f"Gradients ({grad['config']}, {grad['shape']}): max relative error {grad['max_error']:.1e} "
        f"({grad['worst_parameter']}): {verdict}.",
        f"Total {record['seconds']:.0f} s.",
        "Compile s: to the end of the first step, the configurations in turn in one process (the first pays the",
        "process's cold start): not a compile-time comparison (benchmarks/compile_time.py runs each in its own).",
    ]
    return "\n".join(lines) + "\n"


def run_check(model_name: str, dry_run: bool, steps: int, configs: list[str]) -> dict:
    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py: no CUDA device here; use --dry-run to check the script on the CPU")
    shape = DRY_SHAPES[model_name] if dry_run else SHAPES[model_name]
    dtype = torch.float32 if dry_run else torch.bfloat16
    began = time.perf_counter()
    rows = []
    for config in configs:
        try:
            rows.append(measure_config(model_name, config, shape, dtype, device, steps))
        except Exception as error:  # noqa: BLE001 - one failing configuration must not cost the others their rows
            rows.append(dict(model=model_name, config=config, error=f"{type(error).__name__}: {error}"[:300]))
        _release(device)  # the configuration's model and compiled graphs are gone with measure_config's frame
        print(json.dumps(rows[-1], default=str), flush=True)
    gradients = gradient_check(model_name, device)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    calibrated = None
    if device == "cuda":  # the device="calibrated" profile this GPU would get (fxremat/calibrate.py)
        from fxremat.calibrate import measure

        profile = measure(torch.device(device))
        calibrated = dict(matmul_flops=profile.peak_flops(None), copy_bytes_per_s=profile.mem_bandwidth)
    described = f"batch {shape['batch']}, seq {shape['seq']}, {str(dtype).replace('torch.', '')}"
    return dict(
        environment=bench_report.environment(torch.get_num_threads()),  # commit, date, load: the results page's
        model=model_name,
        shape=described,
        config=shape,
        device_name=name,
        torch=torch.__version__,
        dry_run=dry_run,
        rows=rows,
        gradients=gradients,
        calibrated=calibrated,
        seconds=time.perf_counter() - began,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(SHAPES))
    parser.add_argument("--out", default=None, help="folder for the JSON and Markdown")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration (median)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, fp32, CPU: checks the script")
    args = parser.parse_args(argv)
    steps = min(args.steps, 2) if args.dry_run else args.steps
    record = run_check(args.model, args.dry_run, steps, args.configs)
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"gpu_check_{args.model}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))
    table = markdown(record)
    (out / "gpu_check.md").write_text(table)
    print(table)
    failed = [row["config"] for row in record["rows"] if "error" in row]
    return 1 if failed or not record["gradients"]["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
