"""The whole suite's conftest: its options, the private Inductor cache and benchmarks/ on the path.  Nothing here
imports torch, so that tests/solver (plain numbers) runs where torch is not installed (.ci/run does, in a venv
without it).  The torch tiers' helpers are tests/helpers.py, their fixtures registered by each tier's conftest.py."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# A private, empty Inductor cache for the whole test session: warm caches from earlier runs must not hide
# partitioner calls (the cache-hit path is tested on purpose, in its own test).  Set before any test imports torch.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fxremat-tests-inductor-"))

_TESTS = Path(__file__).resolve().parent
# benchmarks/ is a script directory, not a package: its modules (and those of benchmarks/investigations/) are
# imported from there by tests/benchmarks and a few torch-tier tests.
# tests/ itself: the torch tiers import tests/helpers.py by name (pytest's default import mode puts each test
# file's own directory on the path, not its parent's).
sys.path.insert(0, str(_TESTS.parent / "benchmarks"))
sys.path.insert(0, str(_TESTS.parent / "benchmarks" / "investigations"))
sys.path.insert(0, str(_TESTS))


def pytest_addoption(parser):
    # Here, not in tests/robustness/conftest.py: pytest only takes options from the initial conftest files.
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="tests/robustness: fuzz thousands of fresh random models (the same as FXREMAT_FUZZ_LONG=1)",
    )


def pytest_configure(config):
    # The fuzz tests read the environment when their module is imported (hypothesis settings are decorators).
    if config.getoption("--long", default=False):
        os.environ["FXREMAT_FUZZ_LONG"] = "1"


