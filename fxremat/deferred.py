"""Report fields computed on first read: ``Deferred`` (what computes them) and ``_DeferrableField`` (a
``CutReport`` field that may hold one)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Deferred:
    """Report fields that only the report needs, computed together the first time one of them is read:
    ``compute()`` returns their values by field name (a field it leaves out keeps its default).  What ``compute``
    holds (graphs) is released once it has run."""

    def __init__(self, compute: Callable[[], dict[str, Any]]) -> None:
        self._compute: Callable[[], dict[str, Any]] | None = compute
        self._values: dict[str, Any] | None = None
        self._lock = threading.Lock()  # two threads reading a report compute it once

    @property
    def done(self) -> bool:
        """Whether ``compute()`` has run (reading its fields now costs nothing)."""
        return self._values is not None

    def values(self) -> dict[str, Any]:
        with self._lock:
            if self._values is None:
                compute, self._compute = self._compute, None
                self._values = compute()
            return self._values


class _DeferrableField:
    """A ``CutReport`` field whose value may be given as a ``Deferred``: the first read computes it and stores the
    value in its place, so a report reads the same whether its fields were computed early or late."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_{name}"

    def __get__(self, report: Any, owner: type | None = None) -> Any:
        if report is None:
            return self.default  # what dataclasses takes as the field's default
        value = report.__dict__[self.slot]
        if isinstance(value, Deferred):
            value = report.__dict__[self.slot] = value.values().get(self.name, self.default)
        return value

    def __set__(self, report: Any, value: Any) -> None:
        report.__dict__[self.slot] = value
