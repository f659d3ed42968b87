"""What plan choice reads of one graph (``Choosing``), what it returns (``PlanChoice``), and the row a kind of choice
adds to the dispatch (``Chooser``, listed in ``passes/choice/choose.py``'s ``CHOOSERS``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..budget import Plan
from .settings import ChoiceSettings

if TYPE_CHECKING:
    from ..costs import DeviceProfile
    from ..liveness import PeakEstimate
    from ..region_budget import RegionAnnotations
    from .contract import Contract


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

    @functools.cached_property
    def estimator(self) -> tuple[Callable[[Plan], PeakEstimate], bool]:
        """``judged.plan_estimator``'s (estimate, exact), made on first demand, one per graph: the default plan's
        block sums check (``default.block_sums_plan``) and a budget's candidates then share the joint graph's memory
        and each plan's estimate (llama small at memory_budget=0.5: two builds and 28 estimates of 27 plans, before)."""
        from .judged import plan_estimator

        return plan_estimator(self)

    @functools.cached_property
    def contract(self) -> Contract | None:
        """The user's checkpoints as a contract (``contract.user_contract``), made on first demand."""
        from .contract import user_contract

        return user_contract(self.flow, self.roles, self.settings, self.profile)


@dataclass(frozen=True)
class Chooser:
    """One kind of plan choice: ``applies`` to a graph's choice, and then ``choose`` makes it."""

    kind: str
    applies: Callable[[Choosing], bool]
    choose: Callable[[Choosing], PlanChoice]
