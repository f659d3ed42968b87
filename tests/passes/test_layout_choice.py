"""Who decides Inductor's layout optimisation for fxremat's compiles (``FxrematBackend._layout_patches``, issue #19):
off for a graph whose tensors are all on the CPU, unless the user named a layout switch, in ``inductor_options``
or in ``torch._inductor.config``; never for another device.  No compile here (tests/e2e/test_layout_inductor.py
compiles)."""

from __future__ import annotations

import torch
import torch._inductor.config as inductor_config

import fxremat

CPU_INPUTS = [torch.randn(2, 3), 4]


def test_cpu_graph_gets_layout_optimisation_off():
    assert fxremat.backend()._layout_patches(CPU_INPUTS) == {"layout_optimization": False}


def test_inductor_options_naming_a_layout_switch_are_honoured():
    for options in ({"layout_optimization": True}, {"force_layout_optimization": True}):
        assert fxremat.backend(options)._layout_patches(CPU_INPUTS) == {}


def test_a_layout_switch_set_in_inductor_config_is_honoured():
    with inductor_config.patch(force_layout_optimization=True):
        assert fxremat.backend()._layout_patches(CPU_INPUTS) == {}
    with inductor_config.patch(layout_optimization=False):
        assert fxremat.backend()._layout_patches(CPU_INPUTS) == {}


def test_graphs_on_other_devices_keep_inductors_choice():
    assert fxremat.backend()._layout_patches([torch.empty(2, device="meta")]) == {}
    assert fxremat.backend()._layout_patches([torch.randn(2), torch.empty(2, device="meta")]) == {}
    assert fxremat.backend()._layout_patches([3]) == {}


# --- the partitioner's per-graph choice (passes/rewrite/layout_choice.py), on the split it hands Inductor (no compile) ---


def activation_heavy() -> tuple[torch.nn.Module, torch.Tensor]:
    """Activations ~20x the weights (as ``example("convnet")``): mkldnn's contiguous blocked reorders of the
    activations cost more than channels-last's weight copies."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1),
    )  # fmt: skip
    return model, torch.randn(4, 3, 32, 32)


def weight_heavy() -> tuple[torch.nn.Module, torch.Tensor]:
    """Weights ~30x the activations (as ResNet-18's last stages at a small batch): channels-last's weight copies
    cost more."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 96, 3, padding=1, bias=False), torch.nn.ReLU(), torch.nn.Conv2d(96, 64, 3, padding=1)
    )
    return model, torch.randn(1, 64, 4, 4)


def _layout_chosen(model, x):
    """(the layout choice, the report) of fxremat's partition of ``model``, as ``FxrematBackend`` asks for it: under
    the contiguous layout it patches in, with a choice to make."""
    from functorch.compile import make_boxed_func

    from fxremat.backend import FxrematPartitioner
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp
    from fxremat_passes.rewrite.layout_choice import LayoutChoice

    torch._dynamo.reset()
    reports: list = []
    partitioner = FxrematPartitioner(
        Options.create(compare_default=False, strict=True), lambda report, key: reports.append(report), True
    )
    partitioner.current_layout = choice = LayoutChoice()

    def partition_fn(gm, joint_inputs, **kwargs):
        return partitioner(gm, joint_inputs, **kwargs)

    def compiler(gm, example_inputs):
        return make_boxed_func(gm.forward)

    with tp.inductor_config_patched({"layout_optimization": False}):
        torch.compile(model, backend=tp.aot_autograd_as_inductor(partition_fn, compiler))(x).square().mean().backward()
    return choice, reports[0]


def test_activation_heavy_graphs_are_laid_out_channels_last():
    choice, report = _layout_chosen(*activation_heavy())
    contiguous, channels_last = choice.peaks
    assert choice.channels_last and channels_last < contiguous * 0.98
    assert choice.inductor_patch() == {"layout_optimization": True}
    assert (report.inductor_layout, report.layout_simulated_peaks) == ("channels_last", choice.peaks)
    assert report.simulated_peak_bytes == channels_last  # the report's peak is the chosen layout's
    assert "layout handed to Inductor: channels_last" in fxremat.format_text(report)


def test_weight_heavy_graphs_stay_contiguous():
    choice, report = _layout_chosen(*weight_heavy())
    contiguous, channels_last = choice.peaks
    assert choice.channels_last is False and channels_last > contiguous
    assert choice.inductor_patch() == {"layout_optimization": False}
    assert (report.inductor_layout, report.simulated_peak_bytes) == ("contiguous", contiguous)


def test_graphs_without_convolutions_or_a_choice_to_make_report_no_layout():
    choice, report = _layout_chosen(torch.nn.Linear(4, 4), torch.randn(2, 4))
    assert (choice.channels_last, report.inductor_layout, report.layout_simulated_peaks) == (None, None, None)
    assert choice.inductor_patch() == {}


def test_a_chosen_layout_has_a_cache_key_of_its_own():
    """Both a compile whose layout the partitioner chooses and one where the user fixed it contiguous patch
    ``layout_optimization=False`` into Inductor's config: the partitioner's uuid (in AOTAutograd's cache key) must
    tell them apart, or one would be handed the other's compiled graphs (measured: resnet_gn20's channels-last plan
    replaced by the contiguous one in one process)."""
    from fxremat_passes.rewrite.layout_choice import LayoutChoice

    partitioner = fxremat.backend()._partitioner
    fixed = partitioner.uuid()
    partitioner.current_layout = LayoutChoice()
    assert partitioner.uuid() != fixed
