"""Partition time at GPU shapes on a CPU, per setting, on one joint graph (issue #56's partition speed).

    python benchmarks/investigations/partition_profile.py [--model gpt2|llama] [--layers N] [--repeats 3]
                                                         [--settings default mem0.5 peak0.5 pt pt0.5]
                                                         [--profile peak0.5 --top 40]

The model (``gpu_shaped.trace``: ``bench_models.hf_model`` at ``gpu_check.SHAPES``, bf16) is built on ``meta``, given
storage-free parameters under a ``FakeTensorMode`` and traced once through ``aot_function`` with Inductor's
decompositions and no-op compilers; the joint graph is kept.  Each setting then partitions a fresh copy of that
joint with its metadata rewritten to ``cuda`` (``report_snapshot.as_cuda_metadata``): fxremat for ``device="h100"``,
PyTorch's ``min_cut_rematerialization_partition`` at its default and at ``activation_memory_budget=0.5``.  Settings
alternate, ``--repeats`` rounds; printed: each setting's median seconds, min-max, and the report's saved bytes and
simulated peak (a speed change must leave them equal).  ``--layers``: fewer blocks at the same widths, to iterate on
a loaded machine.  ``--profile SETTING``: one more partition of that setting under cProfile, its top entries by
cumulative time.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_shaped  # noqa: E402
from gpu_shaped import as_cuda_metadata  # noqa: E402

SETTINGS = {
    "default": {},
    "mem0.5": {"memory_budget": 0.5},
    "peak0.5": {"peak_budget": 0.5},
    "pt": None,
    "pt0.5": None,
}


def trace_joint(name: str, layers: int | None):
    """(the joint graph with ``cuda`` metadata, its inputs, the partitioner's keyword arguments): traced by
    ``gpu_shaped.trace``, partitioned here once by PyTorch's default so that the trace completes."""
    from fxremat_passes import _torch_private as tp

    kept = []

    def keep(gm, joint_inputs, **kwargs):
        as_cuda_metadata(gm)
        kept.append((copy.deepcopy(gm), joint_inputs, kwargs))
        return tp.pytorch_default_partition(
            gm, joint_inputs, num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
        )

    gpu_shaped.trace(name, keep, layers=layers)
    return kept[0]


def partition_once(joint, setting: str) -> tuple[tuple[float, float], int | None, int | None]:
    """((CPU seconds of this process, wall seconds), saved bytes, simulated peak bytes) of one partition of a fresh
    copy of ``joint``.  CPU time is the steadier of the two on a shared, loaded machine; the report's simulated peak
    is deferred to its first read (``fxremat/simulated.py``), after the clock stops, as in a compile."""
    import fxremat
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp

    gm, joint_inputs, kwargs = joint
    gm = copy.deepcopy(gm)
    as_cuda_metadata(gm)  # deepcopy's metadata is the same fake tensors; rewritten again as the real path does
    if SETTINGS[setting] is None:
        start, wall = time.process_time(), time.perf_counter()
        tp.pytorch_default_partition(
            gm, joint_inputs, num_fwd_outputs=kwargs["num_fwd_outputs"],
            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"),
            activation_memory_budget=0.5 if setting == "pt0.5" else 1.0,
        )
        return (time.process_time() - start, time.perf_counter() - wall), None, None
    reports: list = []
    fn = fxremat.make_partition_fn(Options.create(device="h100", **SETTINGS[setting]), reports)
    start, wall = time.process_time(), time.perf_counter()
    fn(gm, joint_inputs, **kwargs)
    seconds = (time.process_time() - start, time.perf_counter() - wall)
    return seconds, reports[0].saved_bytes, reports[0].simulated_peak_bytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2", choices=sorted(gpu_shaped.SHAPES))
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--profile", default=None, choices=list(SETTINGS))
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    joint = trace_joint(args.model, args.layers)
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in args.settings}
    facts = {}
    for _ in range(args.repeats):
        for setting in args.settings:
            seconds, saved, peak = partition_once(joint, setting)
            times[setting].append(seconds)
            facts[setting] = (saved, peak)
    for setting in args.settings:
        cpu, wall = zip(*times[setting])
        saved, peak = facts[setting]
        print(f"{args.model} layers={args.layers or 'full'} {setting:8} CPU median {statistics.median(cpu):6.2f} s "
              f"(min {min(cpu):.2f}, max {max(cpu):.2f}), wall median {statistics.median(wall):6.2f} s "
              f"(min {min(wall):.2f}, max {max(wall):.2f}), n={len(cpu)}  saved {saved}  simulated peak {peak}",
              flush=True)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        partition_once(joint, args.profile)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
