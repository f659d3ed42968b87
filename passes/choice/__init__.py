"""Plan choice: from the user's settings (``ChoiceSettings``) to one plan of a graph, with its report fields.

The one place plan choice lives (docs/ARCHITECTURE.md).  ``choose`` is the entry (``choose.CHOOSERS``: which kind of
choice a graph gets); ``segmented_split`` runs a split's backward segment by segment; ``kept_tagged`` says which
checkpointed values a plan keeps.  The plain-number parts are the solver tier's (``passes/solver/shortlists.py``).
"""

from .choose import CHOOSERS, choose
from .contract import CONTRACT_FIELDS, kept_tagged
from .records import Chooser, Choosing, PlanChoice
from .segmented import segmented_split
from .settings import ChoiceSettings, FxrematBudgetWarning

__all__ = [
    "CHOOSERS",
    "CONTRACT_FIELDS",
    "PlanChoice",
    "ChoiceSettings",
    "Chooser",
    "Choosing",
    "FxrematBudgetWarning",
    "choose",
    "kept_tagged",
    "segmented_split",
]
