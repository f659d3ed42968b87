"""Every example of examples/ runs as a script (its ``__main__``), at its tiny size, without Inductor's code
generation: a minute at most for all of them together."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


def test_there_are_examples():
    assert {p.stem for p in SCRIPTS} >= {"plain_loop", "hf_trainer", "accelerate_loop", "lightning_fit"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script, no_codegen, capsys):
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "eager" in out and "fxremat cut report" in out
