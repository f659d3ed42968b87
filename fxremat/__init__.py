"""fxremat: a torch.compile backend that decides what to keep for backward and what to recompute, with a min-cut
over real per-node costs (bytes kept alive, FLOPs and memory traffic to recompute).

    model = torch.compile(model, backend="fxremat")
    b = fxremat.backend(memory_price=20.0); model = torch.compile(model, backend=b); ...; b.reports
"""

from fxremat_passes.choice import FxrematBudgetWarning
from fxremat_passes.costs import PROFILES, DeviceProfile

from .backend import FxrematBackend, backend, make_partition_fn, string_backend_reports
from .knobs import FxrematKnobWarning
from .options import Options
from .partition import FxrematFallbackWarning
from .render import format_text
from .report import CutReport
from .verify import FxrematVerifyError, FxrematVerifyWarning

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
