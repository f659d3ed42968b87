"""build_flow_problem: turn a classified, cost-annotated joint graph into a plain-number ``ParametricProblem``.

The values are the nodes that exist outside backward (inputs, forward nodes, backward-only nodes); weights follow
docs/DESIGN.md §2:

* save cost      = price of memory * bytes kept alive + traffic (write in forward if fused away, read in backward)
* recompute cost = the node's recompute seconds under the fusion rule (``costs.py``); 0 for backward-only nodes
  (they run once either way), infinite for inputs and for what may never be recomputed (``roles.py``).

``ParametricProblem.at(price)`` then gives the integer ``CutProblem`` for one price.

``FlowProblem.default_problem``: the same problem for the no-budget default plan, in which the compute-bound
matmul-class values (``ops.COMPUTE_BOUND``) cannot be recomputed, so that the default costs no compute-bound time
(docs/DESIGN.md §4.5).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..solver.parametric import ParametricProblem
from .costs import DeviceProfile, NodeCost
from .ops import COMPUTE_BOUND
from .roles import GraphRoles, Policy, Role, recompute_tag

log = logging.getLogger(__name__)

VALUE_ROLES = (Role.INPUT, Role.FORWARD, Role.BACKWARD_ONLY)
# How much a PREFER_RECOMPUTE tag multiplies a save cost (and PREFER_SAVE a recompute cost): a strong bias that
# a large enough difference in cost still overrides, unlike MUST_*.
PREFER_FACTOR = 10.0
RECOMPUTE_TAGS = (Policy.PREFER_RECOMPUTE, Policy.MUST_RECOMPUTE)
PREFER_KEEP_TAGS = (Policy.PREFER_SAVE, Policy.PREFER_CPU_OFFLOAD)


@dataclass(frozen=True)
class FlowProblem:
    parametric: ParametricProblem
    nodes: tuple[fx.Node, ...]  # value index -> node
    compute_bound: tuple[int, ...] = ()  # values the no-budget default never recomputes (``compute_bound_values``)

    @functools.cached_property
    def default_problem(self) -> ParametricProblem:
        """``parametric`` with the ``compute_bound`` values' recompute cost infinite (None)."""
        if not self.compute_bound:
            return self.parametric
        banned = set(self.compute_bound)
        recompute = tuple(None if v in banned else r for v, r in enumerate(self.parametric.recompute_seconds))
        return dataclasses.replace(self.parametric, recompute_seconds=recompute)


def compute_bound_values(roles: GraphRoles, nodes, costs, traffic, recompute, bandwidth: float) -> tuple[int, ...]:
    """The forward values the no-budget default keeps rather than recomputes (docs/DESIGN.md §4.5): matmul-class
    (``ops.COMPUTE_BOUND``) and compute-bound on the profile (its roofline's FLOP term above its bytes' at
    ``bandwidth``), recomputable, not tagged for recompute by the user (a MUST_/PREFER_RECOMPUTE tag wins), and
    saveable, or a multi-output node (its items are saved instead), so that the default's cut stays finite."""
    return tuple(
        v
        for v, node in enumerate(nodes)
        if costs[node].op_class in COMPUTE_BOUND
        and costs[node].est_seconds > costs[node].bytes_moved / bandwidth
        and roles.role[node] is Role.FORWARD
        and recompute[v] is not None
        and recompute_tag(node) not in RECOMPUTE_TAGS
        and (traffic[v] is not None or isinstance(node.meta.get("val"), (tuple, list)))
    )


def build_flow_problem(roles: GraphRoles, costs: dict[fx.Node, NodeCost], profile: DeviceProfile) -> FlowProblem:
    start = time.perf_counter()
    nodes = tuple(n for n, r in roles.role.items() if r in VALUE_ROLES)
    index = {n: i for i, n in enumerate(nodes)}
    storage_ids: dict[str, int] = {}
    storage_bytes: list[int] = []
    storage: list[int] = []
    traffic: list[float | None] = []
    scale: list[float] = []
    recompute: list[float | None] = []
    for node in nodes:
        cost = costs[node]
        tag = recompute_tag(node)
        if cost.storage_nbytes > 0 and isinstance(node.meta.get("val"), torch.Tensor):
            if cost.alias_root not in storage_ids:
                storage_ids[cost.alias_root] = len(storage_bytes)
                storage_bytes.append(cost.storage_nbytes)
            storage.append(storage_ids[cost.alias_root])
        else:
            storage.append(-1)  # graph inputs and their views, SymInts: nothing new kept alive
        traffic.append(None if node in roles.no_save else cost.save_traffic_bytes / profile.mem_bandwidth)
        scale.append(PREFER_FACTOR if tag == Policy.PREFER_RECOMPUTE else 1.0)
        if roles.role[node] is Role.INPUT or node in roles.no_recompute:
            r = None
        elif roles.role[node] is Role.BACKWARD_ONLY:
            r = 0.0
        else:
            # PREFER_CPU_OFFLOAD: a preference to keep the value, weighed as PREFER_SAVE (DESIGN §16)
            r = cost.recompute_seconds * (PREFER_FACTOR if tag in PREFER_KEEP_TAGS else 1.0)
        recompute.append(r)
    inputs_of = roles.facts.inputs_of
    edges = tuple((index[u], index[w]) for w in nodes for u in dict.fromkeys(inputs_of[w]) if u in index)
    parametric = ParametricProblem(
        num_values=len(nodes),
        storage=tuple(storage),
        storage_bytes=tuple(storage_bytes),
        traffic_seconds=tuple(traffic),
        save_scale=tuple(scale),
        recompute_seconds=tuple(recompute),
        edges=edges,
        needed=tuple(index[n] for n in roles.needed),
    )
    log.debug(
        "build_flow_problem: %d values, %d storages, %d edges, %d needed, %.4fs",
        len(nodes),
        len(storage_bytes),
        len(edges),
        len(parametric.needed),
        time.perf_counter() - start,
    )
    kept = compute_bound_values(roles, nodes, costs, traffic, recompute, profile.mem_bandwidth)
    return FlowProblem(parametric, nodes, kept)
