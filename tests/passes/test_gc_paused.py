"""``simulated.gc_paused``: the collector paused during a partition, and what the pause allocated handed to the
oldest generation on resuming (no walk of it then), without losing garbage or a process's own frozen objects."""

import gc
import weakref

from fxremat import simulated


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_resumes_with_an_empty_youngest_generation_and_no_collection():
    collections = []

    def record(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(record)
    try:
        with simulated.gc_paused():
            assert not gc.isenabled()
            kept = [_Cycle() for _ in range(5000)]  # far past the youngest generation's threshold
        assert gc.isenabled()
        assert gc.get_count()[0] < 100  # counting from zero again, not from the 5000 allocations
        assert collections == []  # resuming collected nothing
        assert gc.get_freeze_count() == 0
    finally:
        gc.callbacks.remove(record)
    assert len(kept) == 5000


def test_garbage_left_in_the_pause_is_collected_by_a_full_collection():
    with simulated.gc_paused():
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle
    assert gone() is not None  # a cycle: only the collector frees it
    gc.collect()
    assert gone() is None


def _is_frozen(obj: object) -> bool:
    """Frozen objects sit in the permanent generation, which ``gc.get_objects`` does not list.  (The freeze count
    is no witness: it drops whenever any frozen object is freed by reference counting, in any thread.)"""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def test_a_process_that_froze_objects_keeps_them_frozen():
    marker = _Cycle()
    gc.collect()
    gc.freeze()
    try:
        assert _is_frozen(marker)
        with simulated.gc_paused():
            [_Cycle() for _ in range(10)]
        assert _is_frozen(marker)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert not _is_frozen(marker)


def test_a_pause_inside_a_pause_leaves_the_collector_off():
    with simulated.gc_paused():
        with simulated.gc_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
