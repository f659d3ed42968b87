"""Issue #15's rows at plan level: saved bytes, simulated step peak, peak_raised_by_budget and backward segments of
a benchmark model at each setting (and the partition's seconds), in seconds rather than minutes (no Inductor code
generation).

    python benchmarks/plan_rows.py MODEL SETTING [SETTING ...]     # SETTING as in setting_peak.py

``bench_models.build_workload(MODEL, "small")`` through AOTAutograd set up as Inductor sets it up
(``tp.aot_autograd_as_inductor``, no-op compilers), with Inductor's own ``compile_fx.partition_fn`` calling
fxremat's partitioner (``tp.after_inductor_joint_passes``), so that Inductor's joint-graph passes run first as in a
real compile (without them Mixtral's plans and peaks differ), and under the layout fxremat's backend compiles a CPU
graph in (contiguous while the plan is chosen, then the layout the partitioner decides: ``layout`` in each row).
The simulated peaks equal ``setting_peak.py``'s where the plans do.
Prints one JSON line per setting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def row(name: str, setting: str) -> dict:
    import bench_models
    import setting_peak
    from functorch.compile import make_boxed_func

    from fxremat.backend import FxrematPartitioner
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.rewrite.layout_choice import LayoutChoice

    torch._dynamo.reset()
    torch.manual_seed(0)
    work = bench_models.build_workload(name, "small")
    reports: list = []
    options = Options.create(compare_default=False, **setting_peak.options_of(setting))
    partitioner = FxrematPartitioner(options, lambda r, _key: reports.append(r), True)
    # as fxremat's backend compiles a CPU graph (``FxrematBackend._layout_patches``): plans chosen under the
    # contiguous layout, the layout decided after (passes/rewrite/layout_choice.py); left to Inductor's default, ViT's
    # patch convolution made its budgets' plans differ from a real compile's
    patches = {"layout_optimization": False} if tp.inductor_layout_switches_at_default() else {}
    partitioner.current_layout = LayoutChoice() if patches else None
    partition = tp.after_inductor_joint_passes(partitioner)
    backend = tp.aot_autograd_as_inductor(partition, lambda gm, _inputs: make_boxed_func(gm.forward))
    with tp.inductor_config_patched(patches):
        work.loss(work.forward(torch.compile(work.model, backend=backend))).backward()
    return dict(
        model=name,
        setting=setting,
        saved=sum(r.saved_bytes for r in reports),
        simulated=sum(r.simulated_peak_bytes or 0 for r in reports),
        raised=sum(r.peak_raised_by_budget or 0 for r in reports),
        segments=sum(len(r.backward_checkpoints or ()) for r in reports),
        partition_s=round(sum(r.partition_seconds for r in reports), 3),
        layout=sorted({r.inductor_layout for r in reports if r.inductor_layout}),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    for setting in sys.argv[2:]:
        print(json.dumps(row(sys.argv[1], setting)), flush=True)
