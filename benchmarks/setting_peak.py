"""One row of issue #15's table: a benchmark model under fxremat at one setting, measured and simulated.

    python benchmarks/setting_peak.py MODEL SETTING
        # SETTING: default, mbX (memory_budget=X), pbX (peak_budget=X); X > 1: bytes

``bench_models.build_workload(MODEL, "small")`` (or a conv net of ``conv_models.py``) compiled with
``fxremat.backend(<setting>, compare_default=False)`` under real Inductor, in this process (run one row per
process, with a ``TORCHINDUCTOR_CACHE_DIR`` of its own or shared by one model's rows): gradients of the first step
against eager (``grad_rule.relative_errors``), two warm-up steps, then one step's peak above what it starts with (CPU
profiler memory events, ``fxremat.measure``).  Prints one JSON line: measured and simulated peak bytes, saved bytes
(the report's, and what autograd keeps by ``saved_tensors_hooks``: distinct storages, parameters, buffers and inputs
excluded), the backward checkpoints of a segmented plan, ``peak_raised_by_budget`` and the worst gradient error.
PyTorch's rows come from ``run.py`` (its partitioner does not depend on fxremat).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def options_of(setting: str) -> dict:
    if setting == "default":
        return {}
    value = float(setting[2:])  # a fraction, or bytes (``mb1000000``: an absolute budget of 1,000,000 B)
    return {{"mb": "memory_budget", "pb": "peak_budget"}[setting[:2]]: value if value <= 1 else int(value)}


def row(name: str, setting: str) -> dict:
    import bench_models
    import conv_models
    import grad_rule

    import fxremat
    from fxremat.measure import measure_saved, step_peak_bytes

    if name in conv_models.CONV_MODELS:
        work = conv_models.build_conv_workload(name)
    else:
        work = bench_models.build_workload(name, "small")
    reference = copy.deepcopy(work.model)
    work.loss(work.forward(reference)).backward()
    expected = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    backend = fxremat.backend(compare_default=False, **options_of(setting))
    compiled = torch.compile(work.model, backend=backend)

    def step():
        work.loss(work.forward(compiled)).backward()

    step()
    grads = {k: p.grad for k, p in work.model.named_parameters() if p.grad is not None}
    errors, _ = grad_rule.relative_errors(grads, expected)
    for _ in range(2):
        work.model.zero_grad(set_to_none=True)
        step()
    work.model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(step, "cpu")
    work.model.zero_grad(set_to_none=True)
    inputs = [*work.model.parameters(), *work.model.buffers(), *work.args, *work.kwargs.values()]
    out, kept = measure_saved(lambda: work.forward(compiled), inputs)  # what autograd keeps (saved_tensors_hooks)
    work.loss(out).backward()
    reports = backend.reports
    return dict(
        model=name,
        setting=setting,
        graphs=len(reports),
        measured=peak,
        simulated=sum(r.simulated_peak_bytes or 0 for r in reports),
        saved=sum(r.saved_bytes for r in reports),
        saved_hooks=kept.nbytes,
        segments=sum(len(r.backward_checkpoints or ()) for r in reports),
        raised=sum(r.peak_raised_by_budget or 0 for r in reports),
        grad=max(errors.values()) if errors else 0.0,
        layouts=[r.inductor_layout for r in reports if r.inductor_layout],  # fxremat's choice (layout_choice.py)
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(row(sys.argv[1], sys.argv[2])), flush=True)
