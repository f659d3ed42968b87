"""The code states the design, not its history: no source file under ``passes/``, ``fxremat/`` or ``tools/`` cites a
work session ("session 12") or the results page (``benchmarks/RESULTS.md``).  A comment says why and points at the
``docs/DESIGN.md`` section that holds the reasoning; measured figures live in the results, which are regenerated and
would leave such a citation pointing at text that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("passes", "fxremat", "tools")
# "session 12", "Session 3", "sessions 31 and 32"; "RESULTS.md" in any case
FORBIDDEN = re.compile(r"\bsessions?\s+\d+|results\.md", re.IGNORECASE)


def source_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md", ".txt"})


def hits(text: str) -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


@pytest.mark.parametrize(
    "line, found",
    [
        ("# measured (benchmarks/RESULTS.md, session 23)", True),
        ("# see Session 7", True),
        ("# sessions 31 and 32", True),
        ("# see results.md", True),
        ("# docs/DESIGN.md §6: the session's Inductor cache", False),  # no number after it
        ("prof.profiler.kineto_results.events()", False),
    ],
)
def test_the_pattern_finds_what_it_should(line, found):
    assert bool(hits(line)) is found


def test_the_folders_hold_source():
    assert len(source_files()) > 50  # the grep below would pass vacuously on a wrong root


def test_no_source_file_cites_a_session_or_the_results_page():
    found = [f"{path.relative_to(ROOT)}:{number}: {line}" for path in source_files()
             for number, line in hits(path.read_text(encoding="utf-8"))]
    assert not found, "cite a docs/DESIGN.md section instead:\n" + "\n".join(found)
