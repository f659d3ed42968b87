"""Front-loaded plans on plain-number problems (no torch): the default plan's first saves kept, the rest traded."""

from __future__ import annotations

from dataclasses import replace

from test_checkpoints import residual_chain

from fxremat_passes.solver.budget import solve_at
from fxremat_passes.solver.front_saves import FRONT_FRACTIONS, front_problems


def _forced(constrained, problem) -> set[int]:
    recompute = constrained.recompute_seconds
    return {v for v, r in enumerate(recompute) if r is None and problem.recompute_seconds[v] is not None}


def test_each_fraction_keeps_the_default_plans_first_saves_and_the_cut_trades_the_rest():
    problem, forward, _ = residual_chain(8)
    default = solve_at(problem, 0.0)  # a zero price: every value kept (each block's a and h: 5 KiB)
    assert default.saved_bytes == 8 * 5120
    problems = front_problems(problem, forward, default.saved)
    # 2, 4, 8, 12 and 16 KiB of 40: nothing fits the first (a block's 4 KiB a comes first), each other a longer prefix
    assert FRONT_FRACTIONS == (0.05, 0.1, 0.2, 0.3, 0.4) and len(problems) == 4
    previous: set[int] = set()
    for constrained in problems:
        forced = _forced(constrained, problem)
        assert previous < forced and max(forced) < min(set(default.saved) - forced)  # a prefix, in graph order
        assert problem.saved_bytes(forced) <= max(FRONT_FRACTIONS) * default.saved_bytes
        fewest = solve_at(constrained, 1.0)  # a huge price: the fewest bytes the constraint allows
        assert set(fewest.saved) - {0} == forced and fewest.saved_bytes == problem.saved_bytes(forced)  # 0: the input
        previous = forced


def test_a_value_that_may_not_be_saved_is_never_forced_and_nothing_saved_means_no_problem():
    problem, forward, _ = residual_chain(4)
    unsaveable = replace(problem, traffic_seconds=(0.0, None, *problem.traffic_seconds[2:]))  # block 0's a
    default = solve_at(problem, 0.0)
    for constrained in front_problems(unsaveable, forward, default.saved):
        assert 1 not in _forced(constrained, unsaveable)
    assert front_problems(problem, forward, ()) == []
