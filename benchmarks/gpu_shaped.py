"""GPU-shaped partitions on a CPU-only machine: the graphs a GPU would hand the partitioner, at their real sizes.

    python benchmarks/gpu_shaped.py [--models gpt2 llama] [--small] [--partitioners fxremat pytorch pytorch_0.5]
                                    [--option memory_budget=0.5 ...] [--json OUT]

Each model is built on ``meta``, given storage-free parameters by ``to_empty(device="cpu")`` under a
``FakeTensorMode``, and traced once through ``aot_function`` with Inductor's decompositions (parameters and buffers
passed as inputs through ``torch.func.functional_call``, the loss inside the model through ``labels=``, no-op
compilers), its joint graph through Inductor's joint-graph passes as ``compile_fx`` runs them before its
partitioner (``_torch_private.after_inductor_joint_passes``; without them the cross-entropy's backward keeps a
tokens x vocabulary one-hot that a real compile rewrites away): nothing is computed, so GPT-2 124M at batch 8 x
1024 partitions in seconds.  Before the partitioner
sees the joint graph every node's ``meta["val"]`` is rewritten to a fake ``cuda`` tensor of the same shape, stride
and dtype (``as_cuda_metadata``), and fxremat prices it with the ``h100`` profile (``device="h100"``): the plan
fxremat would choose on that GPU.  The partition happens at the first forward call; backward is not run.

Models (bf16, ``bench_models.hf_model``, the GPU check's ``gpu_check.SHAPES``): ``gpt2``, transformers'
``GPT2LMHeadModel`` at its default sizes (124M: 12 layers, n_embd 768, vocab 50257), batch 8 x 1024; ``llama``, the
GPU check's Llama-style model (8 layers, dim 2048, grouped-query attention), batch 4 x 2048.  Dropout is off, as in
the GPU check: traced on a CPU, SDPA with a dropout probability becomes the math attention (its score matrices
saved), where a GPU's flash kernel draws the mask inside.  ``--small``: the same structures at a size the tests trace in
seconds.  Partitioners: ``fxremat`` (with ``--option``s), PyTorch's default ``pytorch`` and ``pytorch_0.5``
(``activation_memory_budget=0.5``), each on the same cuda-metadata graph, for partition-time comparisons.

Printed per model and partitioner: the matmul-class kernels recomputed in backward (count, FLOPs;
``ops.COMPUTE_BOUND``), ``est_recompute_seconds``, ``est_step_seconds``, saved bytes, the simulated step peak and
the partition's seconds (informative only on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402

MODELS = ("gpt2", "llama")
PARTITIONERS = ("fxremat", "pytorch", "pytorch_0.5")
DTYPE = torch.bfloat16
# the GPU check's shapes (``bench_models.hf_model``'s keys), and the same structures small: two blocks each, GQA for
# llama (``gpu_check.DRY_SHAPES`` is the same idea, smaller still)
SHAPES = gpu_check.SHAPES
SMALL_SHAPES = {
    "gpt2": dict(layers=2, hidden=128, heads=4, vocab=1024, batch=2, seq=256),
    "llama": dict(layers=2, hidden=256, heads=8, kv_heads=2, ffn=704, vocab=1024, batch=2, seq=256),
}


def as_cuda_metadata(gm: torch.fx.GraphModule) -> None:
    """Rewrites every node's ``meta["val"]`` tensor to a fake ``cuda`` tensor of the same shape, stride and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def to_cuda(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        with mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cuda")

    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["val"] = tree_map(to_cuda, node.meta["val"])


def _on_meta(name: str, small: bool, layers: int | None = None) -> tuple[torch.nn.Module, tuple[int, int]]:
    """(the model on ``meta`` in bf16, its (batch, sequence)); ``layers``: that many instead of the shape's."""
    import transformers

    transformers.logging.set_verbosity_error()
    if name in SHAPES:
        import bench_models

        shape = dict(SMALL_SHAPES[name] if small else SHAPES[name], **({"layers": layers} if layers else {}))
        with torch.device("meta"):
            model = bench_models.hf_model(name, shape, dtype=DTYPE)
        return model, (shape["batch"], shape["seq"])
    raise ValueError(f"unknown model {name!r}; one of {MODELS}")


def _partition_fn(partitioner: str, options: dict, reports: list, seconds: list):
    """The partition function (cuda metadata first), its reports into ``reports`` (fxremat) or a description of
    PyTorch's split (``describe_split`` on the ``h100`` profile), its wall seconds into ``seconds``."""
    import fxremat
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.rewrite.describe import describe_split

    if partitioner == "fxremat":
        inner = fxremat.make_partition_fn(Options.create(**{"device": "h100", **options}), reports)
    elif partitioner in ("pytorch", "pytorch_0.5"):
        budget = 0.5 if partitioner == "pytorch_0.5" else 1.0

        def inner(gm, joint_inputs, **kwargs):
            fw, bw = tp.pytorch_default_partition(
                gm,
                joint_inputs,
                num_fwd_outputs=kwargs["num_fwd_outputs"],
                static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
                activation_memory_budget=budget,
            )
            reports.append(describe_split(fw, bw, kwargs["num_fwd_outputs"], PROFILES["h100"]))
            return fw, bw
    else:
        raise ValueError(f"unknown partitioner {partitioner!r}; one of {PARTITIONERS}")

    def timed(gm, joint_inputs, **kwargs):
        start = time.perf_counter()
        inner(gm, joint_inputs, **kwargs)
        seconds.append(time.perf_counter() - start)

    return on_cuda_copy(timed)


def on_cuda_copy(partition_fn):
    """A partition function that hands ``partition_fn`` a copy of the joint graph with ``cuda`` metadata (what it
    returns is dropped: its graphs may create tensors on the device the metadata names) and returns PyTorch's split
    of the graph as traced, which runs on this CPU's tensors."""
    from fxremat_passes import _torch_private as tp

    def partition(gm, joint_inputs, **kwargs):
        shaped = tp.copy_graph_module(gm)  # node metadata copied, tensors shared
        as_cuda_metadata(shaped)
        partition_fn(shaped, joint_inputs, **kwargs)
        return tp.pytorch_default_partition(
            gm,
            joint_inputs,
            num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
        )

    return partition


def partition(
    name: str, partitioner: str = "fxremat", options: dict | None = None, small: bool = False, decompose: bool = True
):
    """(the reports: fxremat's ``CutReport``s or PyTorch's ``SplitDescription``s, the partition's wall seconds) of
    ``name`` traced at GPU shapes with cuda metadata; ``decompose=False``: without Inductor's decompositions (as a
    plain ``aot_function`` user traces: ``native_layer_norm`` stays one op)."""
    reports: list = []
    seconds: list = []
    trace(name, _partition_fn(partitioner, options or {}, reports, seconds), small, decompose)
    return reports, sum(seconds)


def trace(
    name: str,
    partition_fn,
    small: bool = False,
    decompose: bool = True,
    layers: int | None = None,
    joint_passes: bool = True,
) -> None:
    """One training step of ``name`` built on ``meta`` and traced with fake tensors at GPU shapes (no compute), its
    joint graph, after Inductor's joint-graph passes (``joint_passes``), handed to ``partition_fn`` (which rewrites
    the metadata to ``cuda`` where it wants the GPU's)."""
    from functorch.compile import aot_function, make_boxed_func
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxremat_passes import _torch_private as tp

    if joint_passes:
        partition_fn = tp.after_inductor_joint_passes(_as_custom_partitioner(partition_fn))

    model, (batch, seq) = _on_meta(name, small, layers)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model.to_empty(device="cpu")
        ids = torch.zeros(batch, seq, dtype=torch.long)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)

    def step(*args):
        *tensors, tokens = args
        batch = dict(input_ids=tokens, labels=tokens)
        return torch.func.functional_call(model, dict(zip(names, tensors)), (), batch).loss

    def noop(gm, _inputs):
        return make_boxed_func(gm.forward)

    compiled = aot_function(
        step,
        fw_compiler=noop,
        bw_compiler=noop,
        partition_fn=partition_fn,
        decompositions=tp.inductor_decompositions() if decompose else None,  # the joint graph Inductor would trace
        keep_inference_input_mutations=True,
    )
    with mode, _no_packed_sequence_check():
        compiled(*state.values(), ids)


def _as_custom_partitioner(partition_fn):
    """``partition_fn`` as Inductor's ``custom_partitioner_fn`` takes it (it names its compiler too); not cached."""
    from fxremat_passes import _torch_private as tp

    class Partitioner(tp.CustomPartitionerFn):
        def __call__(self, gm, joint_inputs, compiler=None, **kwargs):
            return partition_fn(gm, joint_inputs, **kwargs)

        def uuid(self) -> None:
            return None

    return Partitioner()


@contextlib.contextmanager
def _no_packed_sequence_check():
    """transformers' Llama asks whether the batch packs several sequences by reading the position ids' values (a
    data-dependent branch that fake tensors under AOTAutograd cannot take); this batch packs none."""
    import transformers.masking_utils as masking

    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def compute_bound_recomputes(recomputed) -> tuple[int, int]:
    """(count, FLOPs) of the matmul-class kernels (``ops.COMPUTE_BOUND``) among a report's ``recomputed`` rows."""
    from fxremat_passes.graph.ops import is_compute_bound_name

    rows = [r for r in recomputed if is_compute_bound_name(r.op)]
    return len(rows), sum(r.flops for r in rows)


def row(name: str, partitioner: str, report, seconds: float) -> dict:
    """One printed row: a report's figures (fxremat's ``CutReport`` or PyTorch's ``SplitDescription``)."""
    count, flops = compute_bound_recomputes(report.recomputed)
    fxremat_report = not hasattr(report, "recompute_seconds")
    return dict(
        model=name,
        partitioner=partitioner,
        recomputed_matmuls=count,
        recomputed_matmul_gflop=flops / 1e9,
        est_recompute_seconds=report.est_recompute_seconds if fxremat_report else report.recompute_seconds,
        est_step_seconds=getattr(report, "est_step_seconds", None),
        saved_bytes=report.saved_bytes,
        simulated_peak_bytes=getattr(report, "simulated_peak_bytes", None),
        partition_seconds=seconds,
    )


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _format(r: dict) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    share = (
        r["est_recompute_seconds"] / r["est_step_seconds"] if r["est_step_seconds"] else None
    )  # the default's extra time, as a fraction of the step
    return (
        f"{r['model']:6} {r['partitioner']:12} matmuls recomputed {r['recomputed_matmuls']:3} "
        f"({r['recomputed_matmul_gflop']:8.1f} GFLOP)  est recompute {fmt(r['est_recompute_seconds'] * 1e3, '.3f')} ms"
        f"  est step {fmt(r['est_step_seconds'] and r['est_step_seconds'] * 1e3, '.3f')} ms"
        f" ({fmt(share and share * 100, '.2f')}%)  saved {r['saved_bytes'] / 2**20:9.1f} MiB"
        f"  simulated peak {fmt(r['simulated_peak_bytes'] and r['simulated_peak_bytes'] / 2**20, '9.1f')} MiB"
        f"  partition {r['partition_seconds']:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--partitioners", nargs="+", default=["fxremat"], choices=PARTITIONERS)
    parser.add_argument("--option", action="append", default=[], help="a fxremat option, e.g. memory_budget=0.5")
    parser.add_argument("--small", action="store_true", help="the same structures at test sizes")
    parser.add_argument("--no-decompositions", action="store_true", help="trace without Inductor's decompositions")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    options = dict(_option(o) for o in args.option)
    rows = []
    for name in args.models:
        for partitioner in args.partitioners:
            reports, seconds = partition(name, partitioner, options, args.small, not args.no_decompositions)
            for report in reports:
                rows.append(row(name, partitioner, report, seconds))
                print(_format(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
