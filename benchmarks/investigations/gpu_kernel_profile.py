"""Where a configuration's step time goes, kernel by kernel: one configuration of ``gpu_check.py``'s models.

    python benchmarks/investigations/gpu_kernel_profile.py gpt2|llama CONFIG OUT_DIR [--steps 3] [--dry-run]

Builds the model at ``gpu_check.py``'s shape, compiles it with CONFIG (``bench_measure.make_backend``'s names),
runs four warm-up steps, then profiles ``--steps`` steps with ``torch.profiler`` (CPU and CUDA activities) and
writes ``prof_<CONFIG>.txt``: ``key_averages()`` sorted by device time (per-op call counts are what show a
recomputed matmul: ``aten::addmm`` called more often per step than under Inductor's default).  It prints the
device kernels launched per step and their device time per step.  With ``TORCHINDUCTOR_CACHE_DIR`` set to a fresh
folder, the generated code lands there; with ``FXREMAT_REPORT_DIR``, fxremat's cut reports (their ``recomputed``
list names each recomputed node with its FLOPs and estimated seconds).  Run one configuration per process.

``--dry-run``: ``gpu_check.py``'s tiny fp32 shape on this machine's CPU (then the device figures are CPU time).
The H100 run's figures: RESULTS.md's GPU table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and measures

import bench_measure  # noqa: E402
import gpu_check  # noqa: E402

WARMUP_STEPS = 4
SORT_KEYS = ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total")


def compiled_step(model_name: str, config: str, dry_run: bool):
    """A function running one training step of ``model_name`` compiled with ``config``, after its first step."""
    device = "cpu" if dry_run else "cuda"
    shape = gpu_check.DRY_SHAPES[model_name] if dry_run else gpu_check.SHAPES[model_name]
    dtype = torch.float32 if dry_run else torch.bfloat16
    model, ids = gpu_check.build(model_name, shape, dtype, device)
    backend, context = bench_measure.make_backend(config, None)
    compiled = torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        compiled(input_ids=ids, labels=ids).loss.backward()

    with context():  # PyTorch's budget is read when the graph is partitioned, in the first step
        step()
    return step, device


def profile_steps(step, device: str, steps: int) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(WARMUP_STEPS):
        step()
    gpu_check._sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        gpu_check._sync(device)
    return prof


def kernel_table(prof: torch.profiler.profile) -> str:
    """``key_averages()`` by self device time (the key's name differs between torch releases)."""
    averages = prof.key_averages()
    for key in SORT_KEYS:
        try:
            return averages.table(sort_by=key, row_limit=80, max_name_column_width=90)
        except (AttributeError, KeyError, ValueError):
            continue
    return averages.table(row_limit=80)


def device_totals(prof: torch.profiler.profile, device: str, steps: int) -> tuple[float, float]:
    """(device kernels launched per step, their device microseconds per step); CPU ops on a dry run."""
    wanted = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    events = [e for e in prof.events() if e.device_type == wanted]
    if device == "cpu":
        events = [e for e in events if e.cpu_parent is None]  # top-level ops only: children are inside them
    micros = sum(getattr(e, "device_time", 0.0) if device == "cuda" else e.cpu_time for e in events)
    return len(events) / steps, micros / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(gpu_check.SHAPES))
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="tiny fp32 shape on this machine's CPU")
    args = parser.parse_args(argv)
    step, device = compiled_step(args.model, args.config, args.dry_run)
    prof = profile_steps(step, device, args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"prof_{args.config}.txt").write_text(kernel_table(prof))
    launched, micros = device_totals(prof, device, args.steps)
    print(f"{args.model} {args.config}: {launched:.0f} kernels per step, {micros / 1e3:.2f} ms of device time per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
