"""Plans judged by their simulated step peak (``JudgedPlans``): the plan-level estimate (``plan_memory.estimate_peak``,
``liveness.simulate_step`` of a plan's split made without splitting it), so only the chosen plan is split; its
estimate is its report's simulation.  A plan whose estimate fails is split and simulated instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _torch_private as tp
from ..graph.roles import Role
from ..graph.stored_sums import block_sums, reads_only
from ..simulator import plan_memory
from ..simulator.liveness import PeakEstimate, simulate_step
from ..simulator.plan_memory import build_joint_memory, estimate_peak
from ..solver.budget import Plan, SolveCache
from ..solver.shortlists import plan_key
from .plan import peak_candidates
from .records import Choosing
from .settings import prices

log = logging.getLogger(__name__)

# Candidate plans judged by their simulated step peak.
PEAK_SIMULATED_CANDIDATES = 10


@dataclass
class JudgedPlans:
    """Each plan's simulated step, made on first demand and kept: its estimate (``estimate``, the simulation of its
    split without the split), or where that fails the simulation of its split.  Only a plan handed on is split
    otherwise (the chosen one); ``exact``: False where Inductor's layout decision is taken on the joint graph rather
    than on each forward (``plan_memory.py``), so the chosen plan's split is simulated for its report."""

    split: Callable[[Plan], tuple]
    estimate: Callable[[Plan], PeakEstimate]
    num_fwd_outputs: int
    required: set = field(default_factory=set)  # plan keys whose simulation must not fail (the default plan)
    exact: bool = True
    inputs: object = None  # the ``SimulatorInputs`` of every simulation (None: the defaults for the graph)
    memory: object = None  # the estimate's ``plan_memory.JointMemory`` (its segmentations' forwards read it)
    # plan -> its split's recipe, made without building the split (``plan_recipe``), or None where it cannot be
    recipe_of: Callable | None = None
    splits: dict = field(default_factory=dict)
    simulations: dict = field(default_factory=dict)
    recipes: dict = field(default_factory=dict)

    def simulation(self, plan: Plan) -> PeakEstimate | None:
        key = plan_key(plan)
        if key not in self.simulations:
            try:
                self.simulations[key] = self.estimate(plan)
            except Exception as error:  # split and simulate it instead
                log.debug("estimate of a candidate plan failed: %s", error, exc_info=True)
                self.simulations[key] = self._simulate_split(plan)
        return self.simulations[key]

    def peak(self, plan: Plan) -> float:
        """The plan's simulated step peak, or infinity where it cannot be simulated."""
        simulation = self.simulation(plan)
        return simulation.peak_bytes if simulation is not None else float("inf")

    def split_of(self, plan: Plan) -> tuple:
        """The plan's (fw, bw, recipe), made once (lazy modules)."""
        return self._split(plan)

    def _split(self, plan: Plan) -> tuple:
        key = plan_key(plan)
        if key not in self.splits:
            # lazy modules: a plan's code is generated only once it is called
            with tp.lazy_graph_modules():
                self.splits[key] = self.split(plan)
        return self.splits[key]

    def _simulate_split(self, plan: Plan) -> PeakEstimate | None:
        fw_bw = self._split(plan)[:2]
        if plan_key(plan) in self.required:
            return simulate_step(*fw_bw, self.num_fwd_outputs, inputs=self.inputs)
        try:
            return simulate_step(*fw_bw, self.num_fwd_outputs, inputs=self.inputs)
        except Exception as error:  # a candidate that cannot be simulated is dropped
            log.debug("simulation of a candidate plan failed: %s", error, exc_info=True)
            return None

    def recipe_and_simulation(self, plan: Plan) -> tuple:
        """(the plan's split recipe, its simulation): ``handed_on``'s, where the estimate is exact without building
        the split (a segmentation reads the recipe alone: ``segmented.py``)."""
        key = plan_key(plan)
        if not self.exact or self.recipe_of is None or key in self.splits:
            (_, _, recipe), simulation = self.handed_on(plan)
            return recipe, simulation
        if key not in self.recipes:
            self.recipes[key] = self.recipe_of(plan)
        if self.recipes[key] is None:  # PyTorch splits it: no recipe, as ``split_with_recipe`` gives none
            return None, self.simulation(plan)
        return self.recipes[key], self.simulation(plan)

    def handed_on(self, plan: Plan) -> tuple[tuple, PeakEstimate]:
        """(the plan's (fw, bw, recipe), its simulation)."""
        key, known = plan_key(plan), plan_key(plan) in self.splits
        split = self._split(plan)
        if not self.exact and not known:
            self.simulations[key] = simulate_step(*split[:2], self.num_fwd_outputs, inputs=self.inputs)
        return split, self.simulations[key]


def plan_estimator(c: Choosing):
    """(the plan-level estimate of a plan's step (``estimate_peak``), whether that estimate is exactly the
    simulation of the plan's split: ``JudgedPlans.exact``, the ``JointMemory`` it reads)."""
    memory = build_joint_memory(c.joint, c.roles, c.request.num_fwd_outputs, c.simulator)
    value_node = _joint_indices(c)
    estimates: dict = {}

    def estimate(plan: Plan):
        key = plan_key(plan)
        if key not in estimates:
            estimates[key] = estimate_peak(memory, {value_node[v] for v in plan.saved})
        return estimates[key]

    return estimate, not memory.channels_last, memory


def graph_estimator(c: Choosing) -> tuple[Callable, bool, object]:
    """``plan_estimator``'s (estimate, exact, memory) for this graph, made on first demand, one per graph: the
    default plan's block sums check (``default.block_sums_plan``) and a budget's candidates then share the joint
    graph's memory and each plan's estimate."""
    found = c.made.get("estimator")
    if found is None:
        found = c.made["estimator"] = plan_estimator(c)
    return found


def judged_plans(c: Choosing, required: set, estimator=None) -> JudgedPlans:
    """The ``JudgedPlans`` of this graph's plans (``estimator``: ``plan_estimator``'s, by default the graph's own,
    ``graph_estimator``)."""
    estimate, exact, memory = estimator or graph_estimator(c)
    return JudgedPlans(
        c.split,
        estimate,
        c.request.num_fwd_outputs,
        required=required,
        exact=exact,
        inputs=c.simulator,
        memory=memory,
        recipe_of=plan_recipe(c, memory),
    )


def plan_recipe(c: Choosing, memory) -> Callable | None:
    """plan -> the recipe of its split (``plan_memory.plan_recipe``: as ``split_with_recipe`` makes it from the
    plan's saved nodes, ``partition._splitter``), or None where PyTorch splits the graph; None where ``memory`` has
    no split facts."""
    if memory is None or memory.facts is None:
        return None
    value_node = _joint_indices(c)
    return lambda plan: plan_memory.plan_recipe(memory, {value_node[v] for v in plan.saved})


def _joint_indices(c: Choosing) -> list[int]:
    """Each flow value's node's index in the joint graph (a plan's saved values as ``JointMemory`` indices)."""
    index = {n: i for i, n in enumerate(c.joint.graph.nodes)}
    return [index[n] for n in c.flow.nodes]


def ranked_candidates(c: Choosing, budget_bytes: int | None, cache: SolveCache | None = None):
    """(candidates fastest first (``plan.peak_candidates``, with the plans that save the block sums where the graph
    has some: ``stored_sums.py``), the plan-level estimator: ``plan_estimator``)."""
    parts, estimator = candidate_parts(c, budget_bytes, cache)
    return parts.every(), estimator


def candidate_parts(c: Choosing, budget_bytes: int | None, cache: SolveCache | None = None):
    """``ranked_candidates`` with its MILP refinements made on demand (``plan.PeakCandidates``)."""
    forward = [c.roles.role[n] is Role.FORWARD for n in c.flow.nodes]
    problem, sums = c.flow.parametric, block_sums(c.roles, c.flow.nodes)
    sums_problem = reads_only(problem, sums, c.profile.mem_bandwidth) if sums else None
    parts = peak_candidates(problem, forward, prices(c.settings, c.profile), budget_bytes, cache, sums_problem)
    return parts, graph_estimator(c)
