"""Per-region budgets on plain-number problems (no torch): every region within its own budget, by the cut's
per-region price search and by the MILP with one row per region; brute force as the oracle on small problems."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_budget import DEFAULT_PRICE, MAX_PRICE, feasible, random_parametric

from fxremat_passes.solver.budget import Plan
from fxremat_passes.solver.milp import objective, solve_milp
from fxremat_passes.solver.mincut import check_plan
from fxremat_passes.solver.region_search import Region, region_bytes, solve_regions


def two_regions(problem, rng: random.Random, budgets) -> list[Region]:
    """The storages split at random into two regions (some left outside both)."""
    groups: list[list[int]] = [[], [], []]
    for k in range(len(problem.storage_bytes)):
        groups[rng.randrange(3)].append(k)
    return [Region(tuple(g), b) for g, b in zip(groups, budgets)]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 25), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_every_region_meets_its_own_fractional_budget(seed, n, first, second):
    rng = random.Random(seed)
    problem = random_parametric(rng, n, shared_storage=True)
    if not feasible(problem):
        return
    regions = two_regions(problem, rng, (first, second))
    search = solve_regions(problem, regions, DEFAULT_PRICE, MAX_PRICE, exact=False)
    exact = solve_regions(problem, regions, DEFAULT_PRICE, MAX_PRICE, exact=True)
    for result in (search, exact):
        assert result.met  # a fraction is always reachable: the fewest-bytes plan meets it
        assert not check_plan(problem.at(DEFAULT_PRICE)[0], result.plan.saved, result.plan.recomputed)
        for region, target, fewest, default in zip(regions, result.targets, result.fewest_bytes, result.default_bytes):
            assert region_bytes(problem, result.plan.saved, region) <= target
            assert target == int(fewest + region.budget * max(0, default - fewest))
    assert (
        objective(problem, exact.plan, DEFAULT_PRICE)
        <= objective(problem, search.plan, DEFAULT_PRICE) * (1 + 1e-9) + 1e-15
    )


def test_budgets_one_and_zero_keep_a_regions_default_and_fewest():
    for seed in range(200):  # the first problem where both regions' plans matter
        rng = random.Random(seed)
        problem = random_parametric(rng, 16)
        if not feasible(problem):
            continue
        regions = two_regions(problem, rng, (1.0, 0.0))
        result = solve_regions(problem, regions, DEFAULT_PRICE, MAX_PRICE, exact=True)
        if all(d > f for d, f in zip(result.default_bytes[:2], result.fewest_bytes[:2])):
            break
    else:
        pytest.fail("no problem where both regions' plans matter")
    assert result.targets == (result.default_bytes[0], result.fewest_bytes[1])
    assert result.saved_bytes[0] <= result.default_bytes[0] and result.saved_bytes[1] == result.fewest_bytes[1]


def test_an_unreachable_byte_budget_gives_the_fewest_bytes_plan_and_says_so():
    for seed in range(200):
        rng = random.Random(seed)
        problem = random_parametric(rng, 12)
        if not feasible(problem):
            continue
        regions = two_regions(problem, rng, (0.5, 0))
        result = solve_regions(problem, regions, DEFAULT_PRICE, MAX_PRICE, exact=True)
        if result.fewest_bytes[1] > 0:
            break
    assert not result.met and result.saved_bytes == result.fewest_bytes


def brute_force(problem, regions, targets, price: float) -> float | None:
    best, cut = None, problem.at(price)[0]
    for states in itertools.product((0, 1, 2), repeat=problem.num_values):
        saved = tuple(v for v, s in enumerate(states) if s == 1)
        recomputed = tuple(v for v, s in enumerate(states) if s == 2)
        if check_plan(cut, saved, recomputed):
            continue
        if any(region_bytes(problem, saved, r) > t for r, t in zip(regions, targets)):
            continue
        value = objective(problem, Plan(price, saved, recomputed, problem.saved_bytes(saved), 0.0), price)
        best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_the_milp_with_a_row_per_region_matches_brute_force(seed):
    rng = random.Random(seed)
    problem = random_parametric(rng, rng.randint(3, 7), shared_storage=True)
    regions = two_regions(problem, rng, (0, 0))
    targets = [rng.randint(0, 150_000), rng.randint(0, 150_000)]
    expected = brute_force(problem, regions, targets, DEFAULT_PRICE)
    rows = [(r.storages, t) for r, t in zip(regions, targets)]
    if expected is None:
        with pytest.raises(Exception):
            solve_milp(problem, DEFAULT_PRICE, storage_budgets=rows)
        return
    exact = solve_milp(problem, DEFAULT_PRICE, storage_budgets=rows).plan
    assert objective(problem, exact, DEFAULT_PRICE) == pytest.approx(expected, rel=1e-6, abs=1e-15)


def test_region_search_does_not_import_torch():
    code = "import sys, fxremat_passes.solver.region_search; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
