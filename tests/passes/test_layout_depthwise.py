"""Issue #19, depthwise nets: mkldnn's depthwise weight gradient with a kernel above 3x3 allocates out channels x kh
x kw x 1 KiB from a channels-last input, and Inductor hands it one whenever backward is layout-optimised, i.e. has a
convolution (``passes/simulator/layout.py``: ``depthwise_buffer_bytes``, ``convolutions_kept_for_depthwise``).  So under
Inductor no plan recomputes a convolution in such a graph, and the simulator counts the buffer where backward does.
No Inductor here: the split is what the partitioner hands Inductor (no-op compilers)."""

from __future__ import annotations

import torch
import torch.nn as nn
from helpers import split_as_compiled

from fxremat.options import Options
from fxremat_passes.graph.ops import CONVOLUTION, CONVOLUTION_BACKWARD
from fxremat_passes.simulator.backends.mkldnn import depthwise_buffer_bytes
from fxremat_passes.simulator.phase import _Phase as Phase


def _net(kernel: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(4, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, kernel, padding=kernel // 2, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 8, 1),
    )  # fmt: skip


def _split(kernel: int, as_inductor: bool, **options):
    """(forward, backward, report) of ``_net(kernel)`` as fxremat hands them to the compiler."""
    options = Options.create(compare_default=False, strict=True, **options)
    return split_as_compiled(
        _net(kernel), torch.randn(2, 4, 8, 8), options, as_inductor, lambda out: out.square().mean()
    )


def _convolutions(gm) -> list:
    return [n for n in gm.graph.nodes if n.target is CONVOLUTION]


def test_no_convolution_recomputed_beside_a_5x5_depthwise_weight_gradient():
    """At ``memory_budget=0.0`` the plan recomputes what it may; under Inductor that excludes the convolutions
    (with a 3x3 depthwise kernel, or for a non-Inductor compiler, it recomputes them), and the report says why."""
    _, bw, report = _split(5, as_inductor=True, memory_budget=0.0)
    assert not _convolutions(bw)
    assert any("depthwise" in reason and count == 3 for reason, count in report.never_recomputed)
    _, bw_3x3, report_3x3 = _split(3, as_inductor=True, memory_budget=0.0)
    assert _convolutions(bw_3x3)
    assert report_3x3.saved_bytes < report.saved_bytes
    _, bw_eager, _ = _split(5, as_inductor=False, memory_budget=0.0)
    assert _convolutions(bw_eager)


def test_depthwise_buffer_counted_where_backward_is_layout_optimised():
    """The buffer's size on the op alone (benchmarks/RESULTS.md, session 15: 16 channels x 5 x 5 x 1 KiB), only on the
    depthwise weight gradient, and in the simulator only for a backward that has a convolution."""
    _, bw, _ = _split(5, as_inductor=False, memory_budget=0.0)  # backward recomputes convolutions
    backward_convs = [n for n in bw.graph.nodes if n.target is CONVOLUTION_BACKWARD]
    buffers = sorted(depthwise_buffer_bytes(n) for n in backward_convs)
    assert buffers == [0, 0, 16 * 5 * 5 * 1024]
    depthwise = next(n for n in backward_convs if depthwise_buffer_bytes(n))
    weight_copies = 2 * 16 * 5 * 5 * 4  # mkldnn's two weight-sized copies (``workspace_bytes``)
    assert Phase(bw.graph, set(), {}, channels_last=True).workspace[depthwise] == weight_copies + buffers[-1]
    assert Phase(bw.graph, set(), {}, channels_last=False).workspace[depthwise] == 0
    _, bw_saved, _ = _split(5, as_inductor=True, memory_budget=0.0)  # no convolution: not layout-optimised
    depthwise_saved = next(n for n in bw_saved.graph.nodes if depthwise_buffer_bytes(n))
    assert Phase(bw_saved.graph, set(), {}, channels_last=True).workspace[depthwise_saved] == weight_copies
