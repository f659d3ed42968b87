"""Inductor's peak-memory reordering on plain integers (fxremat_passes/simulator/peak_order.py)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from fxremat_passes.simulator.peak_order import Buffer, OrderProblem, bfs, dfs, estimate_peak, lpmf, reordered


def _chains_then_join(size: int = 100) -> OrderProblem:
    """Two chains a0 -> a1 and b0 -> b1 and a kernel j reading a1 and b1, in the order a0 b0 a1 b1 j: a0 and b0
    allocate large buffers that their chains' second kernels read and then free."""
    #          a0         b0         a1      b1      j
    preds = (frozenset(), frozenset(), frozenset({0}), frozenset({1}), frozenset({2, 3}))
    buffers = (
        Buffer(size, 0, frozenset({2})),
        Buffer(size, 1, frozenset({3})),
        Buffer(1, 2, frozenset({4})),
        Buffer(1, 3, frozenset({4})),
        Buffer(1, 4, frozenset(), output=True),
    )
    return OrderProblem(preds, buffers)


def test_the_estimate_counts_a_buffer_from_its_kernel_to_its_last_reader():
    problem = _chains_then_join()
    assert estimate_peak(problem, [0, 1, 2, 3, 4]) == 200 + 1  # a0's and b0's buffers live together, a1's beside
    assert estimate_peak(problem, [0, 2, 1, 3, 4]) == 100 + 1 + 1


def test_a_reordering_that_finishes_one_chain_first_is_kept():
    problem = _chains_then_join()
    order = reordered(problem)
    assert estimate_peak(problem, order) == 102
    assert order.index(2) < order.index(1)  # a1 frees a0's buffer before b0 allocates


def test_the_given_order_wins_a_tie():
    preds = (frozenset(), frozenset(), frozenset({0, 1}))
    buffers = (Buffer(10, 0, frozenset({2})), Buffer(10, 1, frozenset({2})), Buffer(5, 2, frozenset(), output=True))
    problem = OrderProblem(preds, buffers)
    assert estimate_peak(problem, [1, 0, 2]) == estimate_peak(problem, [0, 1, 2])
    assert reordered(problem) == [0, 1, 2]


def test_an_input_that_may_be_freed_counts_from_the_start_until_its_last_reader():
    preds = (frozenset(), frozenset({0}))
    buffers = (Buffer(50, -1, frozenset({0})), Buffer(10, 0, frozenset({1})), Buffer(10, 1, frozenset(), output=True))
    assert estimate_peak(OrderProblem(preds, buffers), [0, 1]) == 60  # input and kernel 0's buffer, then 10 + 10


def test_a_graph_output_is_never_freed():
    preds = (frozenset(), frozenset({0}))
    buffers = (Buffer(40, 0, frozenset({1}), output=True), Buffer(10, 1, frozenset(), output=True))
    assert estimate_peak(OrderProblem(preds, buffers), [0, 1]) == 50


def test_before_torch_2_13_the_estimate_subtracts_a_graph_output_at_the_start():
    preds = (frozenset(), frozenset({0}))
    buffers = (Buffer(40, 0, frozenset({1})), Buffer(10, 1, frozenset(), output=True))
    assert estimate_peak(OrderProblem(preds, buffers, outputs_held=False), [0, 1]) == 40  # the output: 10 - 10


def test_kernels_whose_dependencies_have_a_cycle_keep_their_given_order():
    # 1 and 2 wait on each other (no sort schedules them); the given order stands
    preds = (frozenset(), frozenset({0, 2}), frozenset({1}))
    buffers = (Buffer(100, 0, frozenset({1, 2})), Buffer(1, 1, frozenset({2})), Buffer(1, 2, frozenset({1})))
    problem = OrderProblem(preds, buffers)
    assert len(lpmf(problem)) < problem.size
    assert reordered(problem) == [0, 1, 2]


def test_lpmf_takes_the_ready_kernel_that_frees_most_when_nothing_fits_under_the_peak():
    # 0 and 1 are ready; 1 frees the 30-byte input, 0 frees nothing: same allocation, 1 leaves less live
    preds = (frozenset(), frozenset(), frozenset({0, 1}))
    buffers = (
        Buffer(30, -1, frozenset({1})),
        Buffer(10, 0, frozenset({2})),
        Buffer(10, 1, frozenset({2})),
        Buffer(1, 2, frozenset(), output=True),
    )
    assert lpmf(OrderProblem(preds, buffers))[0] == 1


def test_bfs_runs_the_kernel_whose_dependencies_ran_earliest():
    # 1 -> 2, 0 -> 3: after 0 and 1, kernel 3 (its input ran first) comes before 2, whatever their numbers
    preds = (frozenset(), frozenset(), frozenset({1}), frozenset({0}))
    buffers = tuple(Buffer(1, k, frozenset({k + 2})) for k in (0, 1)) + (
        Buffer(1, 2, frozenset(), output=True),
        Buffer(1, 3, frozenset(), output=True),
    )
    assert bfs(OrderProblem(preds, buffers)) == [0, 1, 3, 2]


def test_dfs_visits_the_smaller_kernels_first_each_after_its_dependencies():
    preds = (frozenset(), frozenset(), frozenset({0}))
    buffers = (Buffer(100, 0, frozenset({2})), Buffer(1, 1, frozenset(), output=True), Buffer(1, 2, frozenset()))
    assert dfs(OrderProblem(preds, buffers)) == [1, 0, 2]


@st.composite
def problems(draw):
    n = draw(st.integers(2, 7))
    preds = tuple(frozenset(draw(st.sets(st.integers(0, k - 1), max_size=3)) if k else ()) for k in range(n))
    succ = [{j for j in range(n) if k in preds[j]} for k in range(n)]
    buffers = []
    for k in range(n):
        readers = frozenset(draw(st.sets(st.sampled_from(sorted(succ[k])), max_size=3))) if succ[k] else frozenset()
        buffers.append(Buffer(draw(st.integers(0, 64)), k, readers, draw(st.booleans())))
    for _ in range(draw(st.integers(0, 2))):
        readers = frozenset(draw(st.sets(st.integers(0, n - 1), min_size=1)))
        buffers.append(Buffer(draw(st.integers(1, 64)), -1, readers))
    return OrderProblem(preds, tuple(buffers))


def _topological(problem: OrderProblem, order: list[int]) -> bool:
    place = {k: i for i, k in enumerate(order)}
    return sorted(order) == list(range(problem.size)) and all(
        place[p] < place[k] for k in range(problem.size) for p in problem.preds[k]
    )


@settings(max_examples=200, deadline=None)
@given(problems())
def test_every_sort_is_a_topological_order_and_the_kept_one_is_the_lowest_of_the_four(problem):
    orders = [list(range(problem.size)), lpmf(problem), bfs(problem), dfs(problem)]
    assert all(_topological(problem, o) for o in orders)
    kept = reordered(problem)
    assert estimate_peak(problem, kept) == min(estimate_peak(problem, o) for o in orders)


@settings(max_examples=100, deadline=None)
@given(problems())
def test_the_estimate_is_at_least_every_kernels_allocation_with_its_outputs_live(problem):
    # a brute-force bound: whatever the order, the peak is at least what is live as the largest kernel runs
    sizes = problem.allocated()
    for order in itertools.islice(itertools.permutations(range(problem.size)), 50):
        if _topological(problem, list(order)):
            assert estimate_peak(problem, list(order)) >= max(sizes)
