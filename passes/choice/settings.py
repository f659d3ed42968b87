"""The user's settings plan choice reads (``ChoiceSettings``), and what they mean in seconds per byte (``prices``).

``fxremat/options.py``'s ``Options`` holds these and more; ``ChoiceSettings.of(options)`` takes exactly the ones plan
choice reads, so nothing in ``passes/`` imports ``fxremat/``.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..graph.costs import DeviceProfile

# The price that stands for "infinity": a byte kept costs a million transfer times, which outweighs any recompute
# in these graphs, so the cut minimises bytes (then time, as a tie-break).
FEWEST_BYTES_PRICE_UNITS = 1e6


class FxrematBudgetWarning(UserWarning):
    """A memory budget could not be met; the fewest-bytes plan was used."""


@dataclasses.dataclass(frozen=True)
class ChoiceSettings:
    """The settings plan choice reads (``fxremat/options.py`` documents each)."""

    memory_budget: float | int | None
    peak_budget: float | int | None
    memory_price: float
    solver: str
    compare_default: bool  # a report-oriented run: the report also shows the frontier
    backward_segments: bool | None
    checkpoints: str
    offload: bool | str = False  # False, or "plan": offloads chosen under peak_budget (DESIGN §16)

    @classmethod
    def of(cls, options) -> ChoiceSettings:
        """The plan choice settings of ``options`` (any object with these attributes: ``fxremat.Options``)."""
        return cls(**{f.name: getattr(options, f.name) for f in dataclasses.fields(cls)})


def prices(settings: ChoiceSettings, profile: DeviceProfile) -> tuple[float, float]:
    """(the price of memory of the default plan, the price standing for infinity), in seconds per byte."""
    return settings.memory_price / profile.mem_bandwidth, FEWEST_BYTES_PRICE_UNITS / profile.mem_bandwidth


def warn_unreachable(graph_id: str, target: int, budget, fewest_bytes: int) -> None:
    warnings.warn(
        f"fxremat: {graph_id} cannot keep its saved activations within {target} bytes (memory_budget="
        f"{budget!r}); the fewest it can keep is {fewest_bytes} bytes. Using that plan.",
        FxrematBudgetWarning,
        stacklevel=5,
    )
