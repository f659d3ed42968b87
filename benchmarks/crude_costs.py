"""Before/after for the cost model: fxremat's cut under crude costs (PyTorch's style) and under the real model,
on the same graphs, through Inductor.

    python benchmarks/crude_costs.py [--models mlp block_sdpa block_softmax gpt2_block] [--dim 256] [--steps 20]

Variants (``VARIANTS``; the one place that defines them, ``variant_costs``):

* ``real``: ``annotate_costs`` as shipped (measured pointwise weights, fusion rule).
* ``no_weights``: the same without the pointwise weights: every elementwise op 1 FLOP per element.
* ``crude``: PyTorch's style: every op FlopCounterMode does not count (pointwise, reductions, norms, CPU
  attention, gathers, copies) at 1 FLOP per element it writes (reductions: per element read), no weights, and no
  fusion rule: a recomputed op is its own kernel (roofline with its memory traffic) and saving a value is one read.
* ``pytorch``: PyTorch's own partitioner (``backend="inductor"``), for reference.

Per model and variant: saved bytes from our report and counted independently (``saved_tensors_hooks``, distinct
storages, parameters and inputs excluded), the ops recomputed in backward, their recompute seconds under the
*real* model, and the step time (one thread; every variant compiled first, then steps interleaved across the
variants, median of ``--steps``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from unittest import mock

import torch

VARIANTS = ("crude", "no_weights", "real")


def variant_costs(variant: str, graph, profile, nodes=None, facts=None) -> dict:
    """annotate_costs' output for ``variant`` (written to ``node.meta`` like annotate_costs does)."""
    from fxremat_passes.graph.costs import COST_KEY, _first_tensor_input, annotate_costs, hinted_numel
    from fxremat_passes.graph.ops import FUSIBLE, OpClass, qualified_name

    costs = annotate_costs(graph, profile, nodes, facts)
    if variant == "real":
        return costs
    out = {}
    for node, cost in costs.items():
        dtype = getattr(torch, cost.dtype) if cost.dtype else None
        flops, fused, traffic = cost.flops, cost.op_class in FUSIBLE, cost.save_traffic_bytes
        if cost.op_class is OpClass.POINTWISE:
            flops = hinted_numel(node.meta.get("val"))  # no weights
        if variant == "crude":
            counted = cost.op_class in (OpClass.MATMUL, OpClass.CONVOLUTION) or (
                cost.op_class is OpClass.ATTENTION and "for_cpu" not in qualified_name(node)
            )
            if not counted and cost.flops:
                first = _first_tensor_input(node)
                read = cost.op_class in (OpClass.REDUCTION, OpClass.NORM) and first is not None
                flops = hinted_numel(first) if read else hinted_numel(node.meta.get("val"))
            fused = False
            traffic = cost.storage_nbytes
        est = profile.seconds(flops, cost.bytes_moved, dtype) if cost.flops else cost.est_seconds
        recompute = flops / profile.peak_flops(dtype) if fused else est
        new = dataclasses.replace(
            cost, flops=flops, est_seconds=est, recompute_seconds=recompute, save_traffic_bytes=traffic
        )
        node.meta[COST_KEY] = new
        out[node] = new
    return out


class GPT2BlockLoss(torch.nn.Module):
    """One GPT-2 block (tanh GELU, sdpa) from transformers, random weights."""

    def __init__(self, dim: int):
        super().__init__()
        import transformers
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        config = transformers.GPT2Config(n_embd=dim, n_head=4, n_layer=1, resid_pdrop=0.0, attn_pdrop=0.0)
        config._attn_implementation = "sdpa"
        self.block = GPT2Block(config)

    def forward(self, x):
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def build(name: str, dim: int, batch: int, seq: int):
    """fxremat's examples (``mlp`` is Linear -> GELU (erf) -> Linear) or one GPT-2 block."""
    from fxremat.examples import example

    if name == "gpt2_block":
        return GPT2BlockLoss(dim), (torch.randn(batch, seq, dim),)
    return example(name, batch=batch, seq=seq, dim=dim)


@contextlib.contextmanager
def costs_variant(variant: str, real_by_name: dict):
    """Patch fxremat's partition pass to use ``variant``'s costs; record the real costs by node name."""
    import fxremat.partition as partition
    from fxremat_passes.graph.costs import annotate_costs

    def annotate(graph, profile, nodes=None, facts=None):
        real = annotate_costs(graph, profile, nodes, facts)
        real_by_name.update({n.name: c for n, c in real.items()})
        return variant_costs(variant, graph, profile, nodes, facts)

    with mock.patch.object(partition, "annotate_costs", annotate):
        yield


def run_model(name: str, args) -> list[dict]:
    import fxremat
    from fxremat.measure import measure_saved

    torch.manual_seed(0)
    base, inputs = build(name, args.dim, args.batch, args.seq)
    runs = {}
    for variant in ("pytorch", *VARIANTS):
        model = copy.deepcopy(base)
        real: dict = {}
        if variant == "pytorch":
            backend, patch = "inductor", contextlib.nullcontext()
        else:
            backend, patch = fxremat.backend(compare_default=False, strict=True), costs_variant(variant, real)
        compiled = torch.compile(model, backend=backend)
        exclude = [*model.parameters(), *model.buffers(), *inputs]
        with patch:
            out, saved = measure_saved(lambda c=compiled: c(*inputs), exclude)
            out.sum().backward()
        runs[variant] = dict(model=model, compiled=compiled, saved=saved, real=real, backend=backend, times=[])

    def step(run):
        run["model"].zero_grad(set_to_none=True)
        start = time.perf_counter()
        run["compiled"](*inputs).sum().backward()
        return time.perf_counter() - start

    for run in runs.values():  # warm-up
        for _ in range(3):
            step(run)
    for _ in range(args.steps):
        for run in runs.values():
            run["times"].append(step(run))

    rows = []
    reference = statistics.median(runs["real"]["times"])
    for variant, run in runs.items():
        row = dict(model=name, variant=variant, measured_saved=run["saved"].nbytes)
        row["step_ms"] = statistics.median(run["times"]) * 1e3
        row["step_vs_real"] = row["step_ms"] / (reference * 1e3)
        if variant != "pytorch":
            reports = run["backend"].reports
            row["saved"] = sum(r.saved_bytes for r in reports)
            names = [rc.name for r in reports for rc in r.recomputed]
            ops = [rc.op.removeprefix("aten.") for r in reports for rc in r.recomputed if run["real"][rc.name].flops]
            row["recomputed"] = ", ".join(f"{op} x{n}" for op, n in sorted(Counter(ops).items()))
            row["est_recompute_us"] = sum(run["real"][n].recompute_seconds for n in names) * 1e6
        rows.append(row)
    return rows


def main(argv=None) -> int:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block_sdpa", "block_softmax", "gpt2_block"])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # every variant must reach the partitioner: no FX graph or AOTAutograd cache hits between them
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fxremat-crude-"))
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._dynamo.config.recompile_limit = 64

    rows = []
    for name in args.models:
        rows.extend(run_model(name, args))
        print(f"{name}: done", file=sys.stderr)
    print(
        f"dim {args.dim}, batch {args.batch}, seq {args.seq}, 1 thread, Inductor, median of {args.steps} "
        "interleaved steps; est. recompute under the real model"
    )
    table = [
        [
            r["model"],
            r["variant"],
            f"{r['saved'] / 1024:.0f}" if "saved" in r else "-",
            f"{r['measured_saved'] / 1024:.0f}",
            f"{r['est_recompute_us']:.1f}" if "est_recompute_us" in r else "-",
            f"{r['step_ms']:.2f}",
            f"{r['step_vs_real']:.2f}",
            r.get("recomputed", "-"),
        ]
        for r in rows
    ]
    headers = ["model", "variant", "saved KiB", "measured KiB", "est recompute us", "step ms", "vs real", "recomputed"]
    print(tabulate(table, headers=headers, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
