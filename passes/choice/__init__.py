"""Plan choice: from the user's settings (``ChoiceSettings``) to one plan of a graph, with its report fields.

The one place plan choice lives (docs/ARCHITECTURE.md).  ``choose`` is the entry; ``segmented_split`` runs a split's
backward segment by segment; ``kept_tagged`` says which checkpointed values a plan keeps.
"""

from .contract import CONTRACT_FIELDS, kept_tagged
from .peak import choose, segmented_split
from .settings import ChoiceSettings, FxrematBudgetWarning

__all__ = ["CONTRACT_FIELDS", "ChoiceSettings", "FxrematBudgetWarning", "choose", "kept_tagged", "segmented_split"]
