"""What plan choice reads of one graph (``Choosing``), what it returns (``PlanChoice``), and the row a kind of choice
adds to the dispatch (``Chooser``, listed in ``passes/choice/choose.py``'s ``CHOOSERS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..solver.budget import Plan
from .settings import ChoiceSettings

if TYPE_CHECKING:
    from ..graph.costs import DeviceProfile
    from ..graph.region_budget import RegionAnnotations
    from ..simulator.inputs import SimulatorInputs
    from ..simulator.liveness import PeakEstimate


@dataclass(frozen=True)
class PlanChoice:
    """The chosen plan and its report fields (docs/REPORT.md's JSON schema); ``split``: its (fw, bw, recipe) where
    choosing split it, else None; ``peak``: that split's simulation, or None."""

    plan: Plan
    fields: dict
    split: tuple | None = None
    peak: PeakEstimate | None = None


@dataclass
class Choosing:
    """One graph's plan choice: the user's settings and what the choice reads of the graph.  ``split(plan)`` makes a
    plan's split; ``regions``: the graph's per-region budgets, or None."""

    settings: ChoiceSettings
    flow: object  # flow_problem.FlowProblem
    roles: object  # roles.GraphRoles
    joint: object  # the joint graph (torch.fx.GraphModule)
    profile: DeviceProfile
    request: object  # the partition request: graph_id, num_fwd_outputs
    split: Callable[[Plan], tuple]
    regions: RegionAnnotations | None = None
    simulator: SimulatorInputs | None = None  # what every simulation of this choice assumes (None: the defaults)

    # what the choice makes of the graph on first demand, once per graph (``judged.graph_estimator``,
    # ``contract.contract_of``): the choosers of one graph share it
    made: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Chooser:
    """One kind of plan choice: ``applies`` to a graph's choice, and then ``choose`` makes it."""

    kind: str
    applies: Callable[[Choosing], bool]
    choose: Callable[[Choosing], PlanChoice]
