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
