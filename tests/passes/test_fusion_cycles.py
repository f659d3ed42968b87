"""The fusion cycle check searches only between the two groups (``fusion.TopologicalOrder``): on random unit DAGs
merged in random order, it answers as a search over every group does, and the order it keeps stays topological."""

from __future__ import annotations

import random

import pytest

from fxremat_passes.simulator.fusion import Fusion


def _any_path(succ: dict, start, end) -> bool:
    """The unbounded search: a path start -> x -> ... -> end through another group."""
    stack = [s for s in succ[start] if s is not end]
    seen = set(stack)
    while stack:
        g = stack.pop()
        if g is end:
            return True
        for s in succ[g]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def _random_fusion(seed: int, size: int, shuffled: bool) -> Fusion:
    """Units 0..size-1, each reading a few earlier ones; ``shuffled``: listed out of topological order."""
    rng = random.Random(seed)
    units = list(range(size))
    reads = {u: {rng.randrange(u) for _ in range(rng.randint(0, 3))} if u else set() for u in units}
    listed = rng.sample(units, size) if shuffled else units
    return Fusion(listed, reads, {u: u for u in units}, {u: u for u in units}, access={})


def _topological(fusion: Fusion) -> bool:
    place = fusion.topo.place
    return all(place[g] < place[s] for g in fusion.succ for s in fusion.succ[g])


@pytest.mark.parametrize("seed", range(12))
def test_the_bounded_cycle_check_answers_as_the_full_search(seed):
    fusion = _random_fusion(seed, size=80, shuffled=seed % 3 == 0)
    rng = random.Random(1000 + seed)
    merged = cycles = 0
    for _ in range(400):
        a, b = fusion.find(rng.randrange(80)), fusion.find(rng.randrange(80))
        if a is b:
            continue
        expected = _any_path(fusion.succ, a, b) or _any_path(fusion.succ, b, a)
        assert fusion.creates_cycle(a, b) is expected
        cycles += expected
        if not expected:
            fusion.merge(a, b)
            merged += 1
            assert fusion.topo.kept and _topological(fusion)
    assert merged > 10 and cycles > 10  # both answers were checked


def test_a_merge_that_makes_a_cycle_drops_the_order_and_searches_everything():
    """``merge`` without the check (as a test may call it): no order is kept, and the check still answers."""
    fusion = _random_fusion(7, size=30, shuffled=False)
    a, b = next((a, b) for a in range(30) for b in range(30) if a != b and _any_path(fusion.succ, a, b))
    fusion.merge(a, b)
    assert not fusion.topo.kept
    rng = random.Random(3)
    for _ in range(100):
        x, y = fusion.find(rng.randrange(30)), fusion.find(rng.randrange(30))
        if x is not y:
            expected = _any_path(fusion.succ, x, y) or _any_path(fusion.succ, y, x)
            assert fusion.creates_cycle(x, y) is expected
