"""The benchmark's modules live beside benchmarks/run.py (a script directory, not a package): import them from
there."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
