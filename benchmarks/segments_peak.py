"""Measured step peak of backward checkpoints (passes/rewrite/segments.py, issue #15 "Budget 0.0") under real Inductor.

    python benchmarks/segments_peak.py [--models llama_stack stack6 mlp_stack4] [--out results/segments.json]

Each (model, setting) compiles in its own process with its own Inductor cache directory (a fresh Dynamo, no cached
kernels from another setting).  Settings: ``memory_budget=0.0`` without and with ``backward_segments``,
``peak_budget=0.0``, and the default plan.  Measured: one warm step's peak above its start (CPU profiler memory
events, ``fxremat.measure``, as ``benchmarks/peak_memory.py``), gradients set to None before it; the report's
simulated peak of the same split; the extra FLOPs of the segmented backward; every gradient against eager.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch

SETTINGS = {
    "mb0": dict(memory_budget=0.0),
    "mb0_segments": dict(memory_budget=0.0, backward_segments=True),
    "pb0": dict(peak_budget=0.0),
    "default": dict(),
}
MODELS = ("llama_stack", "llama_stack6", "stack6", "mlp_stack4")


def _workload(name: str):
    from fxremat.examples import MLP, LlamaStack, Stack, example

    torch.manual_seed(0)
    if name == "llama_stack":
        return example("llama_stack", batch=2, seq=128, dim=192)
    if name == "llama_stack6":
        return LlamaStack(6, 192, heads=4, kv_heads=2, max_seq=128), (torch.randn(2, 128, 192),)
    if name == "stack6":
        return Stack(6, 64), (torch.randn(4, 256, 64),)  # activations above the parameters' gradients
    if name == "mlp_stack4":
        return torch.nn.Sequential(*[MLP(128, 512) for _ in range(4)]), (torch.randn(256, 128),)
    raise ValueError(name)


def measure(name: str, setting: str) -> dict:
    """One (model, setting): measured and simulated peak, extra FLOPs, worst gradient error against eager."""
    import fxremat
    from fxremat.measure import max_relative_error, step_peak_bytes

    torch.set_num_threads(1)
    model, inputs = _workload(name)
    reference = copy.deepcopy(model)
    reference(*inputs).sum().backward()
    backend = fxremat.backend(compare_default=False, strict=True, **SETTINGS[setting])
    compiled = torch.compile(model, backend=backend)

    def step():
        compiled(*inputs).sum().backward()

    for _ in range(2):
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(step, "cpu")
    expected = dict(reference.named_parameters())
    error = max(max_relative_error(p.grad, expected[n].grad) for n, p in model.named_parameters())
    report = backend.reports[0]
    return dict(
        model=name,
        setting=setting,
        graphs=len(backend.reports),
        measured_peak_bytes=peak,
        simulated_peak_bytes=report.simulated_peak_bytes,
        simulated_activation_peak_bytes=report.simulated_activation_peak_bytes,
        saved_bytes=report.saved_bytes,
        recompute_flops=report.recompute_flops,
        segment_recompute_flops=report.segment_recompute_flops,
        max_grad_error=error,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "SETTING"), help="measure one, print its JSON")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(*args.one)))
        return 0
    rows = []
    for name in args.models:
        for setting in args.settings:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix=f"ind_{name}_{setting}_"))
            done = subprocess.run(
                [sys.executable, __file__, "--one", name, setting], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                print(name, setting, "failed:", done.stderr[-2000:], file=sys.stderr, flush=True)
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
