"""Checkpoint placement on plain-number problems (no torch): separators are the narrow waists of the forward."""

from __future__ import annotations

from fxremat_passes.solver.budget import solve_at
from fxremat_passes.solver.checkpoints import checkpoint_grid, forward_waists, segment_checkpoints
from fxremat_passes.solver.parametric import ParametricProblem


def residual_chain(blocks: int) -> tuple[ParametricProblem, list[bool], list[int]]:
    """Value 0 is the input; block k reads h_k and computes a (4 KiB) then h_{k+1} = h_k + f(a) (1 KiB each);
    backward needs every a and h.  Returns the problem, the forward mask and the indices of the h's."""
    storage_bytes, edges, needed, hs = [], [], [], [0]
    for _ in range(blocks):
        h = hs[-1]
        a = len(storage_bytes) + 1
        storage_bytes.append(4096)
        storage_bytes.append(1024)
        edges += [(h, a), (h, a + 1), (a, a + 1)]
        needed += [a, a + 1]
        hs.append(a + 1)
    n = len(storage_bytes) + 1
    problem = ParametricProblem(
        num_values=n,
        storage=(-1, *range(n - 1)),
        storage_bytes=tuple(storage_bytes),
        traffic_seconds=(0.0,) + (1e-9,) * (n - 1),
        save_scale=(1.0,) * n,
        recompute_seconds=(None,) + (1e-6,) * (n - 1),
        edges=tuple(edges),
        needed=tuple(needed),
    )
    return problem, [False] + [True] * (n - 1), hs


def test_the_narrowest_open_sets_are_the_block_boundaries():
    problem, forward, hs = residual_chain(8)
    waists = forward_waists(problem, forward)
    boundaries = {waists.positions.index(h) for h in hs[1:-1]}
    for j, members in enumerate(waists.open_sets):
        if j in boundaries:
            assert members == (waists.positions[j],) and waists.open_bytes[j] == 1024
        elif waists.positions[j] != hs[-1]:
            assert waists.open_bytes[j] > 1024  # inside a block, h_k and a are both still to be read
    checkpoints = segment_checkpoints(waists, segment_bytes=2 * 5120)  # two blocks per segment
    assert [waists.positions[j] for j in checkpoints] == [hs[2], hs[4], hs[6]]


def test_checkpointed_plans_keep_their_checkpoints_and_recompute_the_rest():
    problem, forward, hs = residual_chain(16)
    fewest = solve_at(problem, 1.0)  # a huge price: the fewest bytes, i.e. recompute everything from the input
    assert fewest.saved_bytes == 0
    forced_sets = []
    for constrained in checkpoint_grid(problem, forward):
        plan = solve_at(constrained, 1.0)
        forced = {v for v, r in enumerate(constrained.recompute_seconds) if r is None} - {0}
        assert forced <= set(plan.saved) and not forced & set(plan.recomputed)
        assert plan.saved_bytes == sum(problem.value_bytes(v) for v in forced)
        forced_sets.append(forced)
    assert {hs[4], hs[8], hs[12]} in forced_sets  # the sqrt(16) = 4-block spacing
    assert {hs[8]} in forced_sets  # two segments
