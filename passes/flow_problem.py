"""build_flow_problem: turn a classified, cost-annotated joint graph into a plain-integer ``CutProblem``.

The values are the nodes that exist outside backward (inputs, forward nodes, backward-only nodes); weights follow
DESIGN.md §2:

* save cost      = memory_price * bytes kept alive + traffic (write in forward if fused away, read in backward)
* recompute cost = the node's recompute seconds under the fusion rule (``costs.py``); 0 for backward-only nodes
  (they run once either way), infinite for inputs and for what may never be recomputed (``roles.py``).

Seconds are quantised to integers so that all finite capacities sum below the solver's limit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch.fx as fx

from .costs import DeviceProfile, NodeCost
from .mincut import CAPACITY_LIMIT, CutProblem
from .roles import GraphRoles, Policy, Role, recompute_tag

log = logging.getLogger(__name__)

VALUE_ROLES = (Role.INPUT, Role.FORWARD, Role.BACKWARD_ONLY)


@dataclass(frozen=True)
class CutWeights:
    """``memory_price``: seconds charged per byte kept for backward (lambda).  ``prefer_factor``: how much a
    PREFER_RECOMPUTE tag multiplies a save cost (and PREFER_SAVE a recompute cost)."""

    memory_price: float
    prefer_factor: float = 10.0


@dataclass(frozen=True)
class FlowProblem:
    problem: CutProblem
    nodes: tuple[fx.Node, ...]  # value index -> node
    save_seconds: tuple[float | None, ...]
    recompute_seconds: tuple[float | None, ...]
    ints_per_second: float

    def index(self) -> dict[fx.Node, int]:
        return {n: i for i, n in enumerate(self.nodes)}


def save_seconds(cost: NodeCost, weights: CutWeights, profile: DeviceProfile) -> float:
    return weights.memory_price * cost.storage_nbytes + cost.save_traffic_bytes / profile.mem_bandwidth


def quantise(values: list[float | None]) -> tuple[list[int | None], float]:
    """Seconds -> ints with the finite total at half the solver's limit; a non-zero cost stays non-zero."""
    total = sum(v for v in values if v is not None)
    scale = (CAPACITY_LIMIT // 2) / total if total > 0 else 1.0
    out: list[int | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif v <= 0:
            out.append(0)
        else:
            out.append(max(1, round(v * scale)))
    return out, scale


def build_flow_problem(
    roles: GraphRoles, costs: dict[fx.Node, NodeCost], weights: CutWeights, profile: DeviceProfile
) -> FlowProblem:
    start = time.perf_counter()
    nodes = tuple(n for n, r in roles.role.items() if r in VALUE_ROLES)
    index = {n: i for i, n in enumerate(nodes)}
    save: list[float | None] = []
    recompute: list[float | None] = []
    for node in nodes:
        cost = costs[node]
        tag = recompute_tag(node)
        if node in roles.no_save:
            s = None
        else:
            s = save_seconds(cost, weights, profile)
            if tag == Policy.PREFER_RECOMPUTE:
                s *= weights.prefer_factor
        if roles.role[node] is Role.INPUT or node in roles.no_recompute:
            r = None
        elif roles.role[node] is Role.BACKWARD_ONLY:
            r = 0.0
        else:
            r = cost.recompute_seconds
            if tag == Policy.PREFER_SAVE:
                r *= weights.prefer_factor
        save.append(s)
        recompute.append(r)
    quantised, scale = quantise(save + recompute)
    edges = tuple((index[u], index[w]) for w in nodes for u in dict.fromkeys(w.all_input_nodes) if u in index)
    problem = CutProblem(
        num_values=len(nodes),
        save_cost=tuple(quantised[: len(nodes)]),
        recompute_cost=tuple(quantised[len(nodes) :]),
        edges=edges,
        needed=tuple(index[n] for n in roles.needed),
    )
    log.debug(
        "build_flow_problem: %d values, %d edges, %d needed, %.4fs",
        len(nodes),
        len(edges),
        len(problem.needed),
        time.perf_counter() - start,
    )
    return FlowProblem(problem, nodes, tuple(save), tuple(recompute), scale)
