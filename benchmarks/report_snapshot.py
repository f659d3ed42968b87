"""Every report fxremat makes for the example and benchmark models, as JSON: a refactor's check (issue #18).

    python benchmarks/report_snapshot.py --out before.json             # on the commit before the change
    python benchmarks/report_snapshot.py --out after.json --compare before.json

Each model runs one training step through AOTAutograd with fxremat's partitioner and no-op compilers (no Inductor:
seconds, not minutes) at the default setting, ``memory_budget`` 0.5 and 0.0 and ``peak_budget`` 0.0, with
``compare_default=True`` so that every report field is filled.  A report is kept as ``to_dict()`` without its
``*_seconds`` fields at any depth (wall-clock timings differ run to run; time estimates are checked through the
plans they decide), with source paths relative to the repository (two checkouts compare).  ``--compare`` prints
each (model, setting) whose reports differ from the file's, with the first differing keys, and exits 1 if any does.

``--gpu-shaped``: the same graphs as a GPU would hand fxremat, partitioned on this CPU: each joint graph's tensor
metadata is rewritten to fake ``cuda`` tensors of the same shape, stride and dtype before fxremat partitions it
for the ``h100`` profile (the graphs still run on the CPU with no-op compilers).  The simulator's GPU rules are
checked this way on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTINGS = {
    "default": {},
    "mb0.5": {"memory_budget": 0.5},
    "mb0.0": {"memory_budget": 0.0},
    "pb0.0": {"peak_budget": 0.0},
}
EXAMPLES = ("mlp", "block_sdpa", "block_softmax", "stack", "llama_stack", "convnet", "groupnorm_convnet")
HF = ("gpt2", "llama", "bert", "t5", "vit", "mixtral")


REPOSITORY = str(Path(__file__).resolve().parents[1]) + "/"


def _without_timings(value: Any) -> Any:
    """``value`` without wall-clock timings, and with source paths relative to the repository (two checkouts
    compare)."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not k.endswith("_seconds")}
    if isinstance(value, (list, tuple)):
        return [_without_timings(v) for v in value]
    if isinstance(value, str):
        return value.replace(REPOSITORY, "")
    return value


def _workload(name: str):
    import bench_models

    if name in HF:
        return bench_models.build_workload(name, "tiny")
    from fxremat.examples import example

    torch.manual_seed(0)
    model, inputs = example(name)
    return bench_models.Workload(model=model, args=tuple(inputs))


def reports_of(name: str, options: dict, gpu_shaped: bool = False) -> list[dict]:
    from functorch.compile import make_boxed_func
    from gpu_shaped import on_cuda_copy

    import fxremat
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp

    def noop(gm, _inputs):
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    work = _workload(name)
    reports: list = []
    device = {"device": "h100"} if gpu_shaped else {}
    partition_fn = fxremat.make_partition_fn(Options.create(compare_default=True, **device, **options), reports)
    if gpu_shaped:  # reported on a cuda-metadata copy; the step runs PyTorch's split on this CPU
        partition_fn = on_cuda_copy(partition_fn)

    backend = tp.aot_autograd(fw_compiler=noop, bw_compiler=noop, partition_fn=partition_fn)
    work.loss(work.forward(torch.compile(work.model, backend=backend))).backward()
    return [_without_timings(r.to_dict()) for r in reports]


def snapshot(models: list[str], gpu_shaped: bool = False) -> dict[str, list[dict]]:
    out = {}
    for name in models:
        for setting, options in SETTINGS.items():
            out[f"{name} {setting}"] = reports_of(name, options, gpu_shaped)
            print(f"{name} {setting}: {len(out[f'{name} {setting}'])} report(s)", file=sys.stderr)
    return out


def _first_differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b)):
            found += _first_differences(a.get(key), b.get(key), f"{path}.{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _first_differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "."]


def compare(before: dict, after: dict) -> int:
    differing = 0
    for key in sorted(set(before) | set(after)):
        found = _first_differences(before.get(key), after.get(key))
        if found:
            differing += 1
            print(f"DIFFERS {key}: {', '.join(found[:6])}{' ...' if len(found) > 6 else ''}")
    print(f"{len(set(before) | set(after)) - differing} identical, {differing} differing")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[*EXAMPLES, *HF])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="a snapshot written before the change")
    parser.add_argument("--gpu-shaped", action="store_true", help="graphs with cuda metadata, the h100 profile")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # tuples as lists, as the file has them
    result = json.loads(json.dumps(snapshot(args.models, args.gpu_shaped), sort_keys=True))
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.compare:
        return compare(json.loads(Path(args.compare).read_text()), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
