"""The step's schedule with a transfer stream: where each offload's wait and each reload go, the compute stream's
stalls they cause (exposed seconds), and the bytes the device then holds at each point (docs/DESIGN.md §16).

Plain numbers only.  A ``Schedule`` is the simulated step's points in order (forward, the boundary, backward), each
with the bytes held while it runs (``liveness.PeakEstimate.timeline``) and its compute seconds; ``forward_points``
counts the forward's points, ``first_backward`` is the index of backward's first (between them: the boundary).  An
``OffloadUnit`` is one storage: its bytes, the point of its last forward use (the offload is issued after it) and the
point of its first backward use (its reload must end before it).  Where the schedule knows each point's place in
its graph (``Schedule.positions``), a unit's wait and reload stand only before points whose node the graph's
rewrite can put them before (``OffloadUnit.offload_after``, ``reload_by``): the graph's order is not the
schedule's, and each wait or reload is placed in both at once.  ``place`` puts every copy on one first-come
first-served transfer stream and runs the compute stream once with the waits in their places; ``OffloadPlacement``
is the result: where each wait and reload stands, the stalls, and the timeline's bytes with each offloaded storage
gone from its wait to its reload's issue.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    bytes_held: tuple[int, ...]  # per point: the most bytes held while it runs
    seconds: tuple[float, ...]  # per point: its compute-stream seconds
    forward_points: int  # the forward's points come first
    first_backward: int  # index of backward's first point (between the two: the boundary's)
    # per point: its node's index in its own graph (forward's or backward's), -1 where it is none; None: unknown,
    # every point takes a wait or a reload
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.bytes_held) != len(self.seconds):
            raise ValueError("Schedule: one bytes figure and one seconds figure per point")
        if self.positions is not None and len(self.positions) != len(self.seconds):
            raise ValueError("Schedule: one graph position per point")
        if not 0 < self.forward_points <= self.first_backward <= len(self.seconds):
            raise ValueError("Schedule: the forward's points, then the boundary's, then backward's")


@dataclass(frozen=True)
class OffloadUnit:
    name: str
    nbytes: int
    last_forward_use: int  # point index; the copy is issued after it runs
    first_backward_use: int  # point index (>= Schedule.first_backward); the reload must end before it starts
    # the graph index of forward's node the offload is issued after: its wait stands only before a point whose
    # node comes later in graph order (or at forward's end)
    offload_after: int = -1
    # the graph index of backward's node the reload's wait stands before: the reload is issued only before a
    # point whose node comes no later in graph order (None: any)
    reload_by: int | None = None

    def takes_wait(self, schedule: Schedule, point: int) -> bool:
        """Whether this unit's offload's wait may stand before forward point ``point``."""
        return schedule.positions is None or schedule.positions[point] > self.offload_after

    def takes_reload(self, schedule: Schedule, point: int) -> bool:
        """Whether this unit's reload may be issued before backward point ``point``."""
        if schedule.positions is None or self.reload_by is None:
            return True
        return 0 <= schedule.positions[point] <= self.reload_by

    def reload_points(self, schedule: Schedule) -> list[int]:
        """The backward points its reload may be issued before, up to its first use."""
        span = range(schedule.first_backward, self.first_backward_use + 1)
        return [p for p in span if self.takes_reload(schedule, p)]


@dataclass(frozen=True)
class OffloadPlacement:
    waits: tuple[int, ...]  # per unit: the offload's wait stands before this point (frees the device copy)
    reloads: tuple[int, ...]  # per unit: the reload is issued before this point (allocates the device copy)
    copy_spans: tuple[tuple[float, float], ...]  # per unit: (start, end) of its device-to-host copy
    reload_spans: tuple[tuple[float, float], ...]  # per unit: (start, end) of its host-to-device copy
    exposed_seconds: float  # the compute stream's stalls, summed
    stalls: tuple[float, ...]  # per unit: the stalls its wait and its reload's wait caused
    bytes_held: tuple[int, ...]  # the timeline's bytes with the offloaded storages gone while on the host

    @property
    def peak_bytes(self) -> int:
        return max(self.bytes_held, default=0)


def place(schedule: Schedule, units: list[OffloadUnit], transfer_seconds) -> OffloadPlacement:
    """The placement of ``units`` on ``schedule`` (module docstring; DESIGN §16's rules); ``transfer_seconds``:
    bytes -> seconds of one copy over the host link."""
    for unit in units:
        last, first = unit.last_forward_use, unit.first_backward_use
        if not (last < schedule.forward_points and schedule.first_backward <= first < len(schedule.seconds)):
            raise ValueError(f"offload unit {unit.name}: its uses must lie in forward, then backward")
        if not unit.reload_points(schedule):
            raise ValueError(f"offload unit {unit.name}: no backward point up to its first use takes its reload")
    durations = [transfer_seconds(unit.nbytes) for unit in units]
    starts = _ideal_starts(schedule.seconds)
    waits, copy_spans = _offload_waits(schedule, units, durations, starts)
    reloads = _reload_issues(schedule, units, durations, starts)
    stalls, copy_spans, reload_spans = _run(schedule, units, durations, waits, reloads)
    held = list(schedule.bytes_held)
    for unit, wait, reload in zip(units, waits, reloads):
        for point in range(wait, reload):
            held[point] -= unit.nbytes
    return OffloadPlacement(
        tuple(waits), tuple(reloads), copy_spans, reload_spans, sum(stalls), tuple(stalls), tuple(held)
    )


def _ideal_starts(seconds) -> list[float]:
    """Each point's start on the compute stream without stalls, and the step's end last."""
    starts, now = [], 0.0
    for s in seconds:
        starts.append(now)
        now += s
    return [*starts, now]


def _offload_waits(schedule: Schedule, units, durations, starts):
    """Per unit, the point its wait stands before: the first forward point starting at or after its copy's end
    that takes it (``OffloadUnit.takes_wait``; copies issued in the order of their last forward uses, one at a
    time), else the forward's end."""
    waits, spans, free = [0] * len(units), [(0.0, 0.0)] * len(units), 0.0
    for i in sorted(range(len(units)), key=lambda i: (units[i].last_forward_use, i)):
        issued = starts[units[i].last_forward_use + 1]
        start = max(issued, free)
        free = end = start + durations[i]
        spans[i] = (start, end)
        waits[i] = next(
            (
                p
                for p in range(units[i].last_forward_use + 1, schedule.forward_points)
                if starts[p] >= end and units[i].takes_wait(schedule, p)
            ),
            schedule.forward_points,
        )
    return waits, spans


def _reload_issues(schedule: Schedule, units, durations, starts) -> list[int]:
    """Per unit, the point its reload is issued before: as late as the one stream allows (reloads in order of
    first use, each ending by its use and by the next one's start), at the last backward point starting no later
    than that start that takes it (``OffloadUnit.takes_reload``); at the first that takes it where none does."""
    issues, next_start = [schedule.first_backward] * len(units), float("inf")
    for i in sorted(range(len(units)), key=lambda i: (units[i].first_backward_use, i), reverse=True):
        end = min(starts[units[i].first_backward_use], next_start)
        next_start = start = end - durations[i]
        allowed = units[i].reload_points(schedule)
        issues[i] = max((p for p in allowed if starts[p] <= start), default=allowed[0])
    return issues


def _run(schedule: Schedule, units, durations, waits, reloads):
    """The compute stream run once with the waits and reload issues in place: (stalls per unit, copy spans, reload
    spans).  Copies run first come first served on one stream, in the order the compute stream issues them."""
    n, now, free = len(schedule.seconds), 0.0, 0.0
    stalls = [0.0] * len(units)
    copy_spans, reload_spans = [(0.0, 0.0)] * len(units), [(0.0, 0.0)] * len(units)
    issued_after = _by_point(len(units), lambda i: units[i].last_forward_use)
    reloads_at, waits_at = _by_point(len(units), reloads.__getitem__), _by_point(len(units), waits.__getitem__)
    uses_at = _by_point(len(units), lambda i: units[i].first_backward_use)
    for point in range(n):
        for i in waits_at.get(point, ()):  # the offload's wait: the compute stream waits for the copy's end
            stalls[i] += max(0.0, copy_spans[i][1] - now)
            now = max(now, copy_spans[i][1])
        for i in reloads_at.get(point, ()):
            start = max(now, free)
            free = end = start + durations[i]
            reload_spans[i] = (start, end)
        for i in uses_at.get(point, ()):  # the reload's wait, before the first use
            stalls[i] += max(0.0, reload_spans[i][1] - now)
            now = max(now, reload_spans[i][1])
        now += schedule.seconds[point]
        for i in issued_after.get(point, ()):
            start = max(now, free)
            free = end = start + durations[i]
            copy_spans[i] = (start, end)
    return stalls, tuple(copy_spans), tuple(reload_spans)


def _by_point(count: int, point_of) -> dict[int, list[int]]:
    """Unit indices grouped by a point, in unit order within a point."""
    found: dict[int, list[int]] = {}
    for i in range(count):
        found.setdefault(point_of(i), []).append(i)
    return found
