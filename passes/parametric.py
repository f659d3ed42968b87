"""The cut problem as a function of the price of memory, in plain numbers (no torch).

A value ``v`` kept for backward costs ``(traffic_seconds[v] + price * storage_bytes[storage[v]]) * save_scale[v]``;
computing it in backward costs ``recompute_seconds[v]`` (None: impossible).  ``storage[v]`` names the storage that
saving ``v`` keeps alive (views share their base's), -1 for none (graph inputs, SymInts): saved bytes are counted
per distinct storage, as everywhere in fxremat.

``at(price)`` quantises into a ``CutProblem`` for the min-cut solver; the budget search and the exact MILP work on
this object directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .mincut import CAPACITY_LIMIT, CutProblem


@dataclass(frozen=True)
class ParametricProblem:
    num_values: int
    storage: tuple[int, ...]
    storage_bytes: tuple[int, ...]
    traffic_seconds: tuple[float | None, ...]  # None: cannot be saved
    save_scale: tuple[float, ...]  # PREFER_RECOMPUTE makes saving dearer
    recompute_seconds: tuple[float | None, ...]  # None: cannot be recomputed
    edges: tuple[tuple[int, int], ...]
    needed: tuple[int, ...]

    def __post_init__(self) -> None:
        n = self.num_values
        for name in ("storage", "traffic_seconds", "save_scale", "recompute_seconds"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} needs one entry per value")
        for k in self.storage:
            if not -1 <= k < len(self.storage_bytes):
                raise ValueError(f"storage id {k} out of range")

    def value_bytes(self, v: int) -> int:
        k = self.storage[v]
        return 0 if k < 0 else self.storage_bytes[k]

    def save_seconds(self, v: int, price: float) -> float | None:
        traffic = self.traffic_seconds[v]
        if traffic is None:
            return None
        return (traffic + price * self.value_bytes(v)) * self.save_scale[v]

    def saved_bytes(self, saved: Iterable[int]) -> int:
        """Distinct storages kept alive by ``saved`` (inputs free)."""
        storages = {self.storage[v] for v in saved if self.storage[v] >= 0}
        return sum(self.storage_bytes[k] for k in storages)

    def seconds(self, saved: Iterable[int], recomputed: Iterable[int]) -> float:
        """Estimated time a plan adds: traffic of what it saves plus what it recomputes."""
        return sum(self.traffic_seconds[v] or 0.0 for v in saved) + sum(
            self.recompute_seconds[v] or 0.0 for v in recomputed
        )

    def recompute_seconds_of(self, recomputed: Iterable[int]) -> float:
        """Estimated time a plan spends recomputing (what a report calls est_recompute_seconds)."""
        return sum(self.recompute_seconds[v] or 0.0 for v in recomputed)

    def at(self, price: float) -> tuple[CutProblem, float]:
        """The min-cut problem at this price of memory (seconds per byte), and its ints-per-second scale."""
        save = [self.save_seconds(v, price) for v in range(self.num_values)]
        quantised, scale = quantise(save + list(self.recompute_seconds))
        n = self.num_values
        problem = CutProblem(n, tuple(quantised[:n]), tuple(quantised[n:]), self.edges, self.needed)
        return problem, scale


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
