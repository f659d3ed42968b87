"""Every object fxremat exports, and every object those hand a user, survives ``copy.deepcopy`` and ``pickle``:
frameworks copy, pickle or re-apply compile arguments (Lightning deep-copies them; a spawned worker unpickles
them).  Backends and partition functions also keep working after the round trip, and report where their
docstrings say: a deep copy into the original's reports, an unpickled one into its own."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from helpers import run_aot

import fxremat
from fxremat.options import Options


def _pickled(value):
    return pickle.loads(pickle.dumps(value))


ROUND_TRIPS = {"deepcopy": copy.deepcopy, "pickle": _pickled}


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))


def _report() -> fxremat.CutReport:
    reports: list = []
    run_aot(_mlp(), [torch.randn(4, 8)], fxremat.make_partition_fn(Options.create(), reports))
    return reports[0]


def _same_report(a: fxremat.CutReport, b: fxremat.CutReport) -> bool:
    return a.to_dict() == b.to_dict()


# What each exported name hands a user, and how to tell a round-tripped one from the original.  A new export
# without a row fails test_every_export_has_a_case.
INSTANCES = {
    "PROFILES": (lambda: fxremat.PROFILES, lambda a, b: a == b),
    "CutReport": (_report, _same_report),
    "DeviceProfile": (lambda: fxremat.PROFILES["h100"], lambda a, b: a == b),
    "FxrematBackend": (
        lambda: fxremat.backend(memory_budget=0.5, inductor_options={"max_autotune": False}),
        lambda a, b: (a.options, a.inductor_config) == (b.options, b.inductor_config),
    ),
    "FxrematBudgetWarning": (lambda: fxremat.FxrematBudgetWarning("budget"), lambda a, b: a.args == b.args),
    "FxrematFallbackWarning": (lambda: fxremat.FxrematFallbackWarning("fallback"), lambda a, b: a.args == b.args),
    "FxrematKnobWarning": (lambda: fxremat.FxrematKnobWarning("knob"), lambda a, b: a.args == b.args),
    "FxrematVerifyError": (lambda: fxremat.FxrematVerifyError("differs"), lambda a, b: a.args == b.args),
    "FxrematVerifyWarning": (lambda: fxremat.FxrematVerifyWarning("unchecked"), lambda a, b: a.args == b.args),
    "Options": (lambda: Options.create(memory_budget="512MiB", device="a100"), lambda a, b: a == b),
    "backend": (lambda: fxremat.backend(peak_budget=0.5), lambda a, b: a.options == b.options),
    "format_text": (lambda: fxremat.format_text, lambda a, b: a is b),
    "make_partition_fn": (
        lambda: fxremat.make_partition_fn(Options.create(memory_price=3.0), [], as_inductor=True),
        lambda a, b: (a.options, a.as_inductor) == (b.options, b.as_inductor),
    ),
    "string_backend_reports": (_report, _same_report),  # it hands out CutReports
}


def test_every_export_has_a_case():
    assert sorted(INSTANCES) == sorted(fxremat.__all__)


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("name", sorted(fxremat.__all__))
def test_export_round_trips(name, round_trip):
    """The exported object itself (a class or function comes back as itself), and what it hands a user."""
    exported = getattr(fxremat, name)
    again = ROUND_TRIPS[round_trip](exported)
    if inspect.isclass(exported) or inspect.isfunction(exported):
        assert again is exported
    else:
        assert again == exported
    make, same = INSTANCES[name]
    value = make()
    copied = ROUND_TRIPS[round_trip](value)
    assert type(copied) is type(value)
    assert same(copied, value)


def _compile_one_step(backend) -> None:
    model = _mlp()
    torch.compile(model, backend=backend)(torch.randn(4, 8)).sum().backward()


def test_deep_copied_backend_reports_to_the_original(no_codegen):
    original = fxremat.backend(memory_budget=0.5)
    _compile_one_step(copy.deepcopy(original))
    assert len(original.reports) == 1
    assert original.reports[0].memory_budget == 0.5  # the copy compiled with the original's options


def test_unpickled_backend_starts_its_own_reports(no_codegen):
    original = fxremat.backend(memory_budget=0.5)
    unpickled = _pickled(original)
    _compile_one_step(unpickled)
    assert (len(original.reports), len(unpickled.reports)) == (0, 1)
    assert unpickled.reports[0].memory_budget == 0.5


def test_partition_fn_copies_partition():
    """A deep copy fills the caller's list; an unpickled one its own ``reports``; both partition as the original."""
    mine: list = []
    partition_fn = fxremat.make_partition_fn(Options.create(memory_budget=0.5), mine)
    run_aot(_mlp(), [torch.randn(4, 8)], copy.deepcopy(partition_fn))
    unpickled = _pickled(partition_fn)
    run_aot(_mlp(), [torch.randn(4, 8)], unpickled)
    assert len(mine) == 1 and len(unpickled.reports) == 1
    assert mine[0].memory_budget == unpickled.reports[0].memory_budget == 0.5
