"""Issue #19's table for one conv net: what a compiled training step keeps for backward, its peak and its step time,
under eager, Inductor with PyTorch's partitioner, fxremat as it was before issue #19, fxremat with Inductor's
channels-last layout asked for, and fxremat.

    python benchmarks/investigations/conv_saved.py MODEL [--steps 20] [--repetitions 3] [--batch 2] [--json PATH]

MODEL: a ``conv_models.py`` builder (``resnet18``, ``mobilenet_v3_small``, ``efficientnet_b0``, ``convnext_tiny``,
...).  One process, one empty Inductor cache made for the run; each configuration compiles its own copy of the
model (same seed, so the same weights and inputs).  Per configuration: the gradients of its first step against
eager's (``grad_rule.relative_errors``); after two warm-up steps, what autograd keeps (``saved_tensors_hooks``:
distinct storages, parameters, buffers and the input excluded: ``fxremat.measure.measure_saved``) and the weight
copies among them (saved tensors shaped like a 4-D parameter and not contiguous), one step's peak above what it
starts with (CPU profiler memory events); then step times, interleaved as ``step_interleaved.py`` times them (one
step of each configuration in turn, the first rotating, ``--steps`` rounds, medians per repetition).

``fxremat_before`` is an ablation, for the before/after comparison only: fxremat with Inductor's layout optimisation
(``inductor_options={"layout_optimization": True}``, Inductor's own CPU default) and issue #19's two rules for it
skipped while it compiles: ``layout.saved_inputs_as_views`` (so its saved weights are Inductor's channels-last
copies) and ``layout.convolutions_kept_for_depthwise`` (so backward may recompute convolutions).
``fxremat_layout``: fxremat with the layout optimisation asked for (the rules on);
``fxremat_contiguous``: with it turned off; ``fxremat`` chooses per graph, contiguous unless
channels-last simulates a lower peak (``passes/rewrite/layout_choice.py``).  Only on a quiet machine do
the times mean anything; bytes are exact.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and measures

import conv_models  # noqa: E402
import grad_rule  # noqa: E402

CONFIGS = ("eager", "inductor", "fxremat_before", "fxremat_layout", "fxremat_contiguous", "fxremat")
LAYOUT_ON = {"layout_optimization": True}
LAYOUT_OFF = {"layout_optimization": False}


@contextlib.contextmanager
def _issue19_rules_skipped(skip: bool):
    import fxremat.partition as partition
    from fxremat.backend import FxrematPartitioner

    rules = ("saved_inputs_as_views", "convolutions_kept_for_depthwise")
    original, uuid = [getattr(partition, name) for name in rules], FxrematPartitioner.uuid
    if skip:  # and a cache key of its own: the compile caches would hand it fxremat's partition, or the reverse
        partition.saved_inputs_as_views = lambda *args: 0
        partition.convolutions_kept_for_depthwise = lambda *args: {}
        FxrematPartitioner.uuid = lambda self: uuid(self) + "-before-issue-19"
    try:
        yield
    finally:
        for name, value in zip(rules, original):
            setattr(partition, name, value)
        FxrematPartitioner.uuid = uuid


def _compiled(config: str, model: torch.nn.Module):
    import fxremat

    if config == "eager":
        return model, None
    if config == "inductor":
        return torch.compile(model, backend="inductor"), None
    layout = LAYOUT_ON if config in ("fxremat_before", "fxremat_layout") else {}
    layout = LAYOUT_OFF if config == "fxremat_contiguous" else layout
    backend = fxremat.backend(layout, compare_default=False)
    return torch.compile(model, backend=backend), backend


def _weight_copies(model: torch.nn.Module):
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 4}
    found: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.dim() == 4 and tuple(t.shape) in shapes and not t.is_contiguous():
            found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    return found, pack


def measure(name: str, config: str, expected: dict) -> dict:
    from fxremat.measure import measure_saved, step_peak_bytes

    work = conv_models.build_conv_workload(name)
    model, backend = _compiled(config, work.model)

    def step():
        work.loss(work.forward(model)).backward()

    with _issue19_rules_skipped(config == "fxremat_before"):
        step()  # compiles
    grads = {k: p.grad for k, p in work.model.named_parameters() if p.grad is not None}
    errors, _ = grad_rule.relative_errors(grads, expected)
    for _ in range(2):
        work.model.zero_grad(set_to_none=True)
        step()
    work.model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(step, "cpu")
    work.model.zero_grad(set_to_none=True)
    inputs = [*work.model.parameters(), *work.model.buffers(), *work.args]
    out, kept = measure_saved(lambda: work.forward(model), inputs)
    work.loss(out).backward()
    work.model.zero_grad(set_to_none=True)
    copies, pack = _weight_copies(work.model)  # hooks do not nest: a step of its own
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = work.forward(model)
    work.loss(out).backward()
    report_saved = sum(r.saved_bytes for r in backend.reports) if backend is not None else None
    return dict(model=name, batch=conv_models.BATCH, config=config, saved_hooks=kept.nbytes,
                weight_copies=sum(copies.values()), weight_copy_count=len(copies), report_saved=report_saved, peak=peak,
                grad=max(errors.values()) if errors else 0.0, step=step,
                layouts=[r.inductor_layout for r in backend.reports if r.inductor_layout] if backend else [])


def time_interleaved(rows: list[dict], steps: int, repetitions: int) -> None:
    for row in rows:
        row["seconds"] = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repetitions):
            times: dict[str, list[float]] = {r["config"]: [] for r in rows}
            for i in range(steps):
                for row in rows[i % len(rows):] + rows[: i % len(rows)]:
                    start = time.perf_counter()
                    row["step"]()
                    times[row["config"]].append(time.perf_counter() - start)
            for row in rows:
                row["seconds"].append(statistics.median(times[row["config"]]))
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=conv_models.CONV_MODELS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--batch", type=int, default=conv_models.BATCH, help="images per step (default 2)")
    args = parser.parse_args(argv)
    conv_models.BATCH = args.batch
    torch.set_num_threads(1)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="conv_saved_"))
    torch._dynamo.config.cache_size_limit = 64
    reference = conv_models.build_conv_workload(args.model)
    reference.loss(reference.forward(reference.model)).backward()
    expected = {k: p.grad.clone() for k, p in reference.model.named_parameters() if p.grad is not None}
    rows = [measure(args.model, config, copy.deepcopy(expected)) for config in args.configs]
    time_interleaved(rows, args.steps, args.repetitions)
    base = next((r for r in rows if r["config"] == "fxremat_before"), None)
    for row in rows:
        row.pop("step")
        if base is not None:
            row["step_vs_before"] = [s / b for s, b in zip(row["seconds"], base["seconds"])]
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
