"""fxremat: a torch.compile backend that decides what to keep for backward and what to recompute, with a min-cut
over real per-node costs (bytes kept alive, FLOPs and memory traffic to recompute).

    model = torch.compile(model, backend="fxremat")
    b = fxremat.backend(memory_price=20.0); model = torch.compile(model, backend=b); ...; b.reports
"""

from fxremat_passes.graph.costs import PROFILES, DeviceProfile

from .backend import FxrematBackend, backend, make_partition_fn, string_backend_reports
from .options import Options
from .report import CutReport

__all__ = [
    "PROFILES",
    "CutReport",
    "DeviceProfile",
    "FxrematBackend",
    "FxrematBudgetWarning",
    "FxrematFallbackWarning",
    "FxrematKnobWarning",
    "FxrematVerifyError",
    "FxrematVerifyWarning",
    "Options",
    "backend",
    "format_text",
    "make_partition_fn",
    "string_backend_reports",
]

__version__ = "0.1.0"

# Loaded on first use, not with fxremat: a warm compile (an AOTAutograd cache hit) never partitions, and these
# modules (the partitioner's choice, the split, the report's rendering, PyTorch's knobs, verify) are most of
# fxremat's import time (docs/DESIGN.md §8, warm compiles).
_LAZY = {
    "FxrematBudgetWarning": "fxremat_passes.choice",
    "FxrematFallbackWarning": "fxremat.partition",
    "FxrematKnobWarning": "fxremat.knobs",
    "FxrematVerifyError": "fxremat.verify",
    "FxrematVerifyWarning": "fxremat.verify",
    "format_text": "fxremat.render",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fxremat' has no attribute {name!r}")
