"""The cut problem as a function of the price of memory, in plain numbers (no torch).

A value ``v`` kept for backward costs ``(traffic_seconds[v] + price * storage_bytes[storage[v]]) * save_scale[v]``;
computing it in backward costs ``recompute_seconds[v]`` (None: impossible).  ``storage[v]`` names the storage that
saving ``v`` keeps alive (views share their base's), -1 for none (graph inputs, SymInts): saved bytes are counted
per distinct storage, as everywhere in fxremat.

``at(price)`` quantises into a ``CutProblem`` for the min-cut solver; the budget search and the exact MILP work on
this object directly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .mincut import CAPACITY_LIMIT, INFINITE, CutProblem


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
        traffic, recompute = self._seconds_or_zero
        return sum(map(traffic.__getitem__, saved)) + sum(map(recompute.__getitem__, recomputed))

    def recompute_seconds_of(self, recomputed: Iterable[int]) -> float:
        """Estimated time a plan spends recomputing (what a report calls est_recompute_seconds)."""
        return sum(map(self._seconds_or_zero[1].__getitem__, recomputed))

    @functools.cached_property
    def _seconds_or_zero(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(traffic seconds, recompute seconds), 0.0 for None: summed in the same order as the values are given, so
        the same float as summing ``t or 0.0`` value by value (every solve prices its plan so)."""
        return tuple(t or 0.0 for t in self.traffic_seconds), tuple(r or 0.0 for r in self.recompute_seconds)

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(traffic seconds, value bytes, save scale, recompute seconds) as arrays, NaN for None:
        ``at`` runs once per price, hundreds of times in a sweep."""
        traffic = np.array([np.nan if t is None else t for t in self.traffic_seconds], dtype=np.float64)
        value_bytes = np.array([self.value_bytes(v) for v in range(self.num_values)], dtype=np.int64)
        recompute = np.array([np.nan if r is None else r for r in self.recompute_seconds], dtype=np.float64)
        scale = np.array(self.save_scale, dtype=np.float64)
        return traffic, value_bytes, scale, recompute

    def at(self, price: float | Sequence[float]) -> tuple[CutProblem, float]:
        """The min-cut problem at this price of memory (seconds per byte), and its ints-per-second scale.  A
        sequence is a price per storage (per-region budgets, ``region_search.py``)."""
        traffic, value_bytes, scale, recompute = self._arrays
        if not isinstance(price, (int, float)):
            storage = np.asarray(self.storage, dtype=np.int64)
            per_storage = np.asarray(price, dtype=np.float64)
            price = np.where(storage >= 0, per_storage[np.maximum(storage, 0)], 0.0) if len(per_storage) else 0.0
        # elementwise what save_seconds computes, in the same float operations (so the same bits)
        save = (traffic + price * value_bytes.astype(np.float64)) * scale
        costs, scale = _quantised(np.concatenate((save, recompute)))
        n = self.num_values
        return CutProblem.of_arrays(costs[:n], costs[n:], self.edges, self.needed), scale


def quantise(values: np.ndarray) -> tuple[list[int | None], float]:
    """Seconds (NaN: infinite) -> ints with the finite total at half the solver's limit; a non-zero cost stays
    non-zero; None for infinite.  The total is summed in order, as Python's ``sum`` does, and np.rint rounds half to
    even as ``round`` does: the same ints as the scalar reference in tests/solver/test_budget.py."""
    costs, scale = _quantised(values)
    return [None if c == INFINITE else c for c in costs.tolist()], scale


def _quantised(values: np.ndarray) -> tuple[np.ndarray, float]:
    """``quantise`` as an int64 array, ``INFINITE`` for NaN (what ``CutProblem.of_arrays`` takes)."""
    finite = ~np.isnan(values)
    total = sum(values[finite].tolist())
    scale = (CAPACITY_LIMIT // 2) / total if total > 0 else 1.0
    ints = np.where(values > 0, np.maximum(1, np.rint(values * scale)), 0).astype(np.int64)
    return np.where(finite, ints, INFINITE), scale
