"""The CPU peak-memory measurement (torch profiler memory events) against allocations of known size, and the
gradient check against eager."""

import bench_measure as bm
import torch

MIB = 2**20


def test_profiler_peak_sees_a_4mib_allocation():
    def step():
        x = torch.empty(4 * MIB, dtype=torch.uint8)
        x.fill_(1)  # touch it, so nothing can elide the allocation
        del x

    peak = bm.cpu_peak_bytes(step)
    assert 4 * MIB <= peak < 5 * MIB, peak


def test_profiler_peak_counts_frees_before_later_allocations():
    def step():
        a = torch.ones(MIB, dtype=torch.uint8)
        del a  # freed before b exists: the peak is one MiB, not two
        b = torch.ones(MIB, dtype=torch.uint8)
        del b

    assert MIB <= bm.cpu_peak_bytes(step) < 2 * MIB


def test_peak_from_memory_events_orders_by_time_and_starts_at_zero():
    events = [(3, -100), (1, 100), (2, 50), (4, 10)]
    assert bm.peak_from_memory_events(events) == 150
    assert bm.peak_from_memory_events([(1, -64), (2, 32)]) == 0  # a free of older memory never counts as use
    assert bm.peak_from_memory_events([]) == 0


def _linear_with_grads(weight_grad, bias_grad):
    model = torch.nn.Linear(2, 2)
    model.weight.grad, model.bias.grad = weight_grad, bias_grad
    return model


def test_grad_errors_compare_a_mathematically_zero_gradient_on_the_models_scale():
    # a key bias: eager's gradient is rounding noise, the compiled one is other noise, relatively 200% apart
    reference = {"weight": torch.ones(2, 2), "bias": torch.full((2,), 1e-11)}
    model = _linear_with_grads(torch.ones(2, 2) * (1 + 1e-6), torch.full((2,), -1e-11))
    error, near_zero = bm.grad_errors(model, reference)
    assert error < 1e-5 and near_zero == ["bias"]


def test_grad_errors_still_catch_wrong_and_missing_gradients():
    reference = {"weight": torch.ones(2, 2), "bias": torch.ones(2)}
    assert bm.grad_errors(_linear_with_grads(torch.ones(2, 2), 2 * torch.ones(2)), reference) == (1.0, [])
    assert bm.grad_errors(_linear_with_grads(torch.ones(2, 2), None), reference)[0] == float("inf")
