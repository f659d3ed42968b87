"""Declaring ``CutReport``'s fields and reading them back from JSON, by their declarations alone (a new
report field is one change in ``fxremat/report.py``): ``derived`` (a field computed from the others) and
``decoders`` (``CutReport.from_dict``'s, from each field's type)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Any


def derived(compute: Callable[[Any], Any]) -> Any:
    """A ``CutReport`` field computed from the report's other fields when it is made (and made again by
    ``with_changes`` and ``from_dict``): no stage passes it.  ``compute`` must read no deferred field (that would
    run the simulation the report defers)."""
    return dataclasses.field(default=None, init=False, metadata={"derive": compute})


@functools.cache
def decoders(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """(field name, how ``from_dict`` turns its JSON back) for each init field of dataclass ``cls`` whose JSON is
    not already its value."""
    hints = typing.get_type_hints(cls)
    found = ((f.name, _decoder(hints[f.name])) for f in dataclasses.fields(cls) if f.init)
    return tuple((name, decode) for name, decode in found if decode is not None)


def _decoder(hint: Any) -> Callable[[Any], Any] | None:
    """How a value of type ``hint`` comes back from JSON (tuples were written as lists, dataclasses as objects),
    or None where JSON's value is the value (numbers, strings, booleans, None)."""
    if dataclasses.is_dataclass(hint):
        inner = decoders(hint)
        return lambda data: hint(**{**data, **{n: d(data[n]) for n, d in inner if n in data}})
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (types.UnionType, typing.Union):  # X | None: X's, and None stays None
        inner = _decoder(args[0]) if len(args) == 1 else None
        return None if inner is None else lambda value: None if value is None else inner(value)
    if typing.get_origin(hint) is tuple:
        items = [_decoder(a) for a in args if a is not Ellipsis]
        if len(args) == 2 and args[1] is Ellipsis and items[0] is not None:  # tuple[X, ...] of X to turn back
            return lambda values: tuple(items[0](v) for v in values)
        return tuple
    return None
