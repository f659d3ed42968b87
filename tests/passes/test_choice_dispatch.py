"""Plan choice's dispatch (``passes/choice/choose.py``'s ``CHOOSERS``) and the settings it reads (``ChoiceSettings``),
without a graph: which kind of choice each combination of settings gets."""

from __future__ import annotations

import dataclasses

import pytest

from fxremat.options import Options
from fxremat_passes.choice import CHOOSERS, ChoiceSettings, Choosing


def test_choice_settings_are_options_fields():
    options = Options.create(memory_budget=0.5, peak_budget=0.25, checkpoints="replan", solver="milp")
    settings = ChoiceSettings.of(options)
    names = {f.name for f in dataclasses.fields(ChoiceSettings)}
    assert names <= {f.name for f in dataclasses.fields(Options)}
    assert all(getattr(settings, name) == getattr(options, name) for name in names)


def _kind(regions=None, contract=None, **options) -> str:
    choosing = Choosing(ChoiceSettings.of(Options.create(**options)), None, None, None, None, None, None, regions)
    choosing.made["contract"] = contract  # what contract.contract_of would make of a graph
    return next(c for c in CHOOSERS if c.applies(choosing)).kind


@pytest.mark.parametrize(
    "regions, contract, options, kind",
    [
        ("regions", "contract", dict(peak_budget=0.5, memory_budget=0.5), "per-region budgets"),
        (None, "contract", dict(peak_budget=0.5, memory_budget=0.5), "peak_budget"),
        (None, "contract", dict(memory_budget=0.5), "memory_budget, peak-judged"),
        (None, None, dict(memory_budget=1.0), "saved bytes"),
        (None, None, dict(memory_budget=0.5, solver="milp"), "saved bytes"),
        (None, "contract", dict(memory_budget=0.5, solver="milp"), "the user's checkpoints"),
        (None, "contract", dict(), "the user's checkpoints"),
        (None, None, dict(), "saved bytes"),
    ],
)
def test_each_setting_gets_its_kind_of_choice(regions, contract, options, kind):
    assert _kind(regions, contract, **options) == kind
