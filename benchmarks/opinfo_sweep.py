"""PyTorch's OpInfo database through ``aot_autograd_check`` with fxremat's partition function (issue #23).

Every op variant's samples (float32, CPU, ``requires_grad=True``) go through
``torch.testing._internal.optests.aot_autograd_check``, the check of PyTorch's own ``test_aotdispatch.py``: outputs and
gradients under AOTAutograd against eager, with fxremat's partitioner (``strict=True``: a failure of ours raises
instead of falling back to PyTorch's) in place of ``min_cut_rematerialization_partition``.  Each variant that fails
is run again with PyTorch's partitioner, and the table puts the two side by side: a failure under fxremat that
PyTorch's partitioner does not also have is ours.

    python benchmarks/opinfo_sweep.py --max-samples 2            # every op variant, static and dynamic shapes
    python benchmarks/opinfo_sweep.py --ops sin mm --static-only  # a few
    python benchmarks/opinfo_sweep.py --dynamic --max-samples 1   # dynamic shapes only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from unittest import mock

import torch
from torch.testing._internal import common_methods_invocations
from torch.testing._internal.optests import aot_autograd as optests_aot

import fxremat
from fxremat.options import Options

# Exceptions of tracing (data-dependent shapes and control flow), not of a partitioner: test_aotdispatch.py skips them.
TRACING_LIMITS = ("DynamicOutputShapeException", "GuardOnDataDependentSymNode", "DataDependentOutputException")


@dataclass
class VariantResult:
    op: str  # name.variant
    dynamic: bool
    samples: int
    fxremat_error: str | None = None  # the first failing sample's error under fxremat
    pytorch_error: str | None = None  # the same sample under PyTorch's partitioner (None: passes)
    skipped: str | None = None  # a tracing limit, the same for both partitioners

    @property
    def ours_only(self) -> bool:
        return self.fxremat_error is not None and self.pytorch_error is None


REPORTS: list = []  # every report of fxremat's partitions in this process (a test checks that ours ran)


def _fxremat_partition():
    return fxremat.make_partition_fn(Options.create(strict=True), REPORTS)


def check_sample(op, sample, dynamic: bool, partition_fn) -> str | None:
    """None if the sample passes with ``partition_fn``; else the error's first line."""
    args = [sample.input, *sample.args]
    try:
        with mock.patch.object(optests_aot, "min_cut_rematerialization_partition", partition_fn):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optests_aot.aot_autograd_check(
                    op.op, args, sample.kwargs, dynamic, check_gradients=True, try_check_data_specialization=False
                )
    except Exception as error:  # noqa: BLE001 - every failure is a row of the table
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return text[:300]
    return None


def sweep_variant(op, dynamic: bool, max_samples: int) -> VariantResult:
    name = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:max_samples]
    result = VariantResult(name, dynamic, len(samples))
    for sample in samples:
        error = check_sample(op, sample, dynamic, _fxremat_partition())
        if error is None:
            continue
        if any(limit in error for limit in TRACING_LIMITS):
            result.skipped = error
            continue
        result.fxremat_error = error
        result.pytorch_error = check_sample(op, sample, dynamic, optests_aot.min_cut_rematerialization_partition)
        break
    return result


def selected_ops(names: list[str] | None):
    for op in common_methods_invocations.op_db:
        if not op.supports_autograd or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        if names and op.name not in names:
            continue
        yield op


def run(
    names: list[str] | None, max_samples: int, dynamic_modes: tuple[bool, ...], progress=None
) -> list[VariantResult]:
    """Every selected variant in every shape mode; ``progress``: a text file each row is written to as it is done
    (one JSON object a line), so that a long sweep cut short keeps what it ran."""
    results = []
    for op in selected_ops(names):
        for dynamic in dynamic_modes:
            torch._dynamo.reset()
            results.append(sweep_variant(op, dynamic, max_samples))
            if progress is not None:
                progress.write(json.dumps(asdict(results[-1])) + "\n")
                progress.flush()
    return results


def summary(results: list[VariantResult], seconds: float) -> str:
    failed = [r for r in results if r.fxremat_error is not None]
    ours = [r for r in failed if r.ours_only]
    lines = [
        f"{len(results)} op variants x shapes, {sum(r.samples for r in results)} samples, {seconds:.0f} s: "
        f"{len(results) - len(failed)} pass under fxremat, {len(failed)} fail "
        f"({len(ours)} that PyTorch's partitioner passes), {sum(r.skipped is not None for r in results)} with "
        "samples skipped (tracing limits)",
    ]
    for r in failed:
        shape = "dynamic" if r.dynamic else "static"
        theirs = "passes" if r.pytorch_error is None else r.pytorch_error
        lines.append(f"  {r.op} ({shape}): fxremat {r.fxremat_error} | PyTorch's partitioner: {theirs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", help="op names (default: every op with autograd and float32)")
    parser.add_argument("--max-samples", type=int, default=3, help="samples per op variant (default 3)")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--static-only", action="store_true", help="static shapes only (default: both)")
    shapes.add_argument("--dynamic", action="store_true", help="dynamic shapes only (default: both)")
    parser.add_argument("--json", help="also write every row to this file")
    parser.add_argument("--progress", help="append each row to this file (JSON lines) as soon as it is done")
    args = parser.parse_args(argv)
    if args.max_samples < 1:
        parser.error("--max-samples must be at least 1")
    start = time.perf_counter()
    modes = (False,) if args.static_only else (True,) if args.dynamic else (False, True)
    if args.progress:
        with open(args.progress, "a") as progress:
            results = run(args.ops, args.max_samples, modes, progress)
    else:
        results = run(args.ops, args.max_samples, modes)
    if args.ops and not results:
        parser.error(f"no op with autograd and float32 on CPU is called {args.ops}; see op_db's names")
    print(summary(results, time.perf_counter() - start))
    if args.json:  # the rows with where and when they ran: benchmarks/results_page.py reads both
        import bench_report  # benchmarks/, beside this script

        record = dict(environment=bench_report.environment(torch.get_num_threads()), rows=[asdict(r) for r in results])
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 1 if any(r.ours_only for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
