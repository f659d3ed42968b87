"""The exact peak MILP's bookkeeping (``peak_milp.py``): columns by key, rows as sparse triplets, solved by scipy's
``milp`` (HiGHS).  No torch."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Program:
    """Columns by key, rows as sparse triplets: the MILP's bookkeeping."""

    def __init__(self) -> None:
        self.columns: dict[tuple, int] = {}
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.entries: list[tuple[int, int, float]] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []

    def var(self, key: tuple, lower: float = 0.0, upper: float = 1.0, integer: bool = True) -> int:
        self.columns[key] = len(self.cost)
        self.cost.append(0.0)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(1 if integer else 0)
        return self.columns[key]

    def col(self, *key) -> int | None:
        return self.columns.get(key)

    def row(self, terms: Iterable[tuple[int | None, float]], lower: float, upper: float) -> None:
        row = len(self.row_lower)
        self.entries.extend((row, c, v) for c, v in terms if c is not None and v != 0.0)
        self.row_lower.append(lower)
        self.row_upper.append(upper)

    def solve(self, time_limit: float):
        from scipy.optimize import Bounds, LinearConstraint, milp  # imported on first use: see mincut.py
        from scipy.sparse import coo_array

        rows, cols, vals = zip(*self.entries) if self.entries else ((), (), ())
        matrix = coo_array((vals, (rows, cols)), shape=(len(self.row_lower), len(self.cost))).tocsr()
        return milp(
            np.array(self.cost),
            constraints=LinearConstraint(matrix, np.array(self.row_lower), np.array(self.row_upper)),
            integrality=np.array(self.integer),
            bounds=Bounds(np.array(self.lower), np.array(self.upper)),
            options={"time_limit": time_limit},
        )
