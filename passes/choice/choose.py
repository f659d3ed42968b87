"""``choose``: which kind of plan choice a graph gets, in one table (``CHOOSERS``), first row that applies.

Each kind is one module of ``passes/choice/`` with its ``CHOOSER`` row (``records.Chooser``: when it applies, and
the function that chooses); a new kind of budget is a new module and its row here, where the order is precedence.
"""

from __future__ import annotations

from .contract import CHOOSER as CONTRACT
from .default import CHOOSER as SAVED_BYTES
from .memory_budget import CHOOSER as MEMORY_BUDGET
from .peak import CHOOSER as PEAK_BUDGET
from .records import Chooser, Choosing, PlanChoice
from .regions import CHOOSER as REGIONS
from .settings import ChoiceSettings

CHOOSERS: tuple[Chooser, ...] = (
    REGIONS,  # per-region budgets: by saved bytes alone
    PEAK_BUDGET,  # peak_budget (with memory_budget's bytes, and within a checkpoint contract)
    MEMORY_BUDGET,  # memory_budget, peak-judged (within a checkpoint contract)
    CONTRACT,  # no budget, the user's checkpoints honoured
    SAVED_BYTES,  # no budget, or a solver's plan within memory_budget's bytes
)


def choose(
    flow, roles, joint, settings: ChoiceSettings, profile, request, split, regions=None, simulator=None
) -> PlanChoice:
    """The plan for these settings (``CHOOSERS``).  ``split(plan)`` makes a plan's split; ``regions``: per-region
    budgets (``regions.py``, chosen by saved bytes alone); ``simulator``: the ``SimulatorInputs`` plans are judged
    under.  Otherwise, with checkpoint tags in the graph (and
    ``checkpoints="honour"``), every choice also keeps within the user's plan (``contract.py``)."""
    choosing = Choosing(settings, flow, roles, joint, profile, request, split, regions, simulator)
    chooser = next(c for c in CHOOSERS if c.applies(choosing))
    return chooser.choose(choosing)
