"""The layout decision as an input of the simulator (``SimulatorInputs.layout_optimisation``,
``forces_layout_optimisation``, ``mkldnn_enabled``; docs/DESIGN.md §6.0): ``layout.layout_optimised`` replays
Inductor's own per-graph decision (``GraphLowering.decide_layout_opt``) from those values, whatever Inductor's
live config says, and a simulated step depends on the inputs it is given, not on that config; likewise how
Inductor's peak estimate counts a graph's outputs (``estimate_counts_outputs``)."""

from __future__ import annotations

import contextlib
import itertools
import sys
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
from helpers import capture_joint
from torch._inductor.graph import GraphLowering

from fxremat.examples import example
from fxremat_passes.simulator.inputs import SimulatorInputs
from fxremat_passes.simulator.layout import has_convolution, layout_optimised
from fxremat_passes.simulator.liveness import simulate_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_shaped  # noqa: E402  (benchmarks/: graphs given cuda metadata, as at GPU shapes)

SWITCHES = list(itertools.product([False, True], repeat=3))  # (layout_optimisation, forced, mkldnn_enabled)


def _convs(*layers) -> tuple[nn.Module, list[torch.Tensor]]:
    """A chain of 2-D convolutions (``(in, out, kernel, groups)`` each) with a ReLU between, on a 2x3x8x8 input."""
    modules = []
    for cin, cout, kernel, groups in layers:
        modules += [nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups), nn.ReLU()]
    return nn.Sequential(*modules), [torch.randn(2, 3, 8, 8)]


# One joint graph for each of Inductor's reasons off its GPU path (``decide_layout_opt``): grouped convolutions with
# more than one input channel per group, fewer output than input channels, all channels small; and two it lays out.
MODELS = {
    "small_channels": lambda: example("convnet"),
    "wide": lambda: _convs((3, 96, 3, 1), (96, 128, 3, 1)),
    "grouped": lambda: _convs((3, 96, 1, 1), (96, 96, 3, 2)),
    "fewer_outputs": lambda: _convs((3, 128, 1, 1), (128, 32, 3, 1)),
    "depthwise": lambda: _convs((3, 96, 1, 1), (96, 96, 3, 96)),
    "no_convolution": lambda: (nn.Linear(8, 8), [torch.randn(2, 8)]),
}


def _as_cuda(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with every value's metadata a fake ``cuda`` tensor (Inductor's GPU path of the decision)."""
    gpu_shaped.as_cuda_metadata(gm)
    return gm


@pytest.fixture(scope="module")
def joints() -> dict[str, torch.fx.GraphModule]:
    graphs = {}
    for name, make in MODELS.items():
        torch.manual_seed(0)
        graphs[name] = capture_joint(*make())[0]
        graphs[f"{name}_cuda"] = _as_cuda(capture_joint(*make())[0])
    return graphs


def _inputs(layout: bool, forced: bool, mkldnn: bool) -> SimulatorInputs:
    return SimulatorInputs.default("cpu").with_changes(
        layout_optimisation=layout, forces_layout_optimisation=forced, mkldnn_enabled=mkldnn
    )


@contextlib.contextmanager
def _live(layout: bool, forced: bool, mkldnn: bool):
    """Inductor's config and mkldnn's switch set so (restored after)."""
    with inductor_config.patch(layout_optimization=layout, force_layout_optimization=forced):
        with _mkldnn(mkldnn):
            yield


def _mkldnn(enabled: bool):
    """``torch.backends.mkldnn.enabled`` so inside (its other flags as they are)."""
    return torch.backends.mkldnn.flags(enabled=enabled, deterministic=None, allow_tf32=None, fp32_precision=None)


def test_the_replayed_decision_is_inductors_under_those_switches_whatever_the_live_config(joints):
    decisions = {}
    for (name, gm), switches in itertools.product(joints.items(), SWITCHES):
        with _live(*switches):  # a graph without a convolution has nothing to lay out, forced or not
            expected = has_convolution(gm) and bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
        opposite = tuple(not s for s in switches)
        before = (inductor_config.layout_optimization, inductor_config.force_layout_optimization)
        with _live(*opposite):
            assert layout_optimised(gm, _inputs(*switches)) == expected, (name, switches)
            # the replay's own patch is undone
            assert (inductor_config.layout_optimization, inductor_config.force_layout_optimization) == opposite[:2]
            assert torch.backends.mkldnn.enabled == opposite[2]
        assert (inductor_config.layout_optimization, inductor_config.force_layout_optimization) == before
        decisions[name, switches] = expected
    # the graphs exercise the decision: Inductor's GPU heuristics answer both ways, its CPU rule lays every
    # convolution out, and its switches matter
    on_gpu_path = {name: decisions[name, (True, False, True)] for name in joints if name.endswith("_cuda")}
    assert on_gpu_path == {
        "small_channels_cuda": False,
        "wide_cuda": True,
        "grouped_cuda": False,
        "fewer_outputs_cuda": False,
        "depthwise_cuda": True,
        "no_convolution_cuda": False,
    }
    assert all(decisions[name, (True, False, True)] for name in MODELS if name != "no_convolution")
    assert decisions["grouped", (True, False, True)] and not decisions["grouped", (True, False, False)]
    assert decisions["grouped_cuda", (True, True, True)] and not decisions["wide", (False, True, True)]


def _convnet_split():
    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import default_partition

        captured["fw"], captured["bw"] = default_partition(gm, joint_inputs, **kwargs)
        return captured["fw"], captured["bw"]

    from helpers import run_aot

    torch.manual_seed(0)
    run_aot(*example("convnet"), partition_fn)
    return captured["fw"], captured["bw"]


LIVE_CONFIGS = [
    {},
    {"layout_optimization": False},
    {"force_layout_optimization": True},
    {"reorder_for_peak_memory": False},
    {"allow_buffer_reuse": False},
]


@pytest.mark.parametrize("mkldnn", [True, False], ids=["mkldnn", "no_mkldnn"])
def test_a_simulated_step_depends_on_its_inputs_not_on_inductors_live_config(mkldnn):
    fw, bw = _convnet_split()
    for layout in (True, False):
        inputs = SimulatorInputs.default("cpu").with_changes(layout_optimisation=layout)
        reference = simulate_step(fw, bw, 1, inputs=inputs)
        for config in LIVE_CONFIGS:
            with inductor_config.patch(config), _mkldnn(mkldnn):
                assert simulate_step(fw, bw, 1, inputs=inputs) == reference, (layout, config)
    # and the layout input is read: the convnet's channels-last step holds its inputs' copies
    channels_last = simulate_step(fw, bw, 1, inputs=SimulatorInputs.default("cpu"))
    contiguous = simulate_step(fw, bw, 1, inputs=SimulatorInputs.default("cpu").with_changes(layout_optimisation=False))
    assert channels_last.peak_bytes != contiguous.peak_bytes


def test_how_inductors_estimate_counts_outputs_is_an_input_too():
    """``SimulatorInputs.estimate_counts_outputs`` (a fact of the torch release, asked of Inductor once per partition)
    is what the reordering's problem reads (``phase_reorder.order_problem``)."""
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.simulator.liveness import simulated_backward
    from fxremat_passes.simulator.phase_reorder import order_problem

    fw, bw = _convnet_split()
    default = SimulatorInputs.default("cpu")
    assert default.estimate_counts_outputs == tp.inductor_estimate_counts_outputs()
    for held in (True, False):
        phase = simulated_backward(fw, bw, 1, inputs=default.with_changes(estimate_counts_outputs=held))
        order = phase.fusion_order()
        assert order_problem(phase, order).outputs_held is held
