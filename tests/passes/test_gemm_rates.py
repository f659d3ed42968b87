"""Matmul-class kernels priced by shape at achieved throughput (passes/graph/gemm_rates.py, docs/DESIGN.md §4.2)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes.graph.costs import PROFILES, compute_node_cost
from fxremat_passes.graph.gemm_rates import GemmModel, GemmShape, gemm_shape

H100 = PROFILES["h100"]
BF16 = "bfloat16"


def achieved(shape: tuple[int, int, int, int], profile=H100, dtype=BF16) -> float:
    """FLOP/s the profile's model gives a GEMM of (batch, m, n, k)."""
    flops = 2.0 * shape[0] * shape[1] * shape[2] * shape[3]
    return flops / profile.gemm.seconds(flops, dtype, GemmShape(*shape), attention=False)


# (device, shape (batch, m, n, k), what the device measured in TFLOP/s, tolerance): the profiles reproduce the
# measurements they were fitted to (GPU_NOTES; GPT-2's three 768-deep addmms ran 927.6 GFLOP at ~595 TFLOP/s in all)
MEASURED = [
    ("h100", (1, 8192, 8192, 8192), 798, 0.001),
    ("h200", (1, 8192, 8192, 8192), 788, 0.001),
    ("h100", (1, 8192, 2304, 768), 595, 0.03),
    ("h100", (1, 8192, 3072, 768), 595, 0.03),
    ("a100", (1, 6912, 2048, 16384), 267.9, 0.03),
]


@pytest.mark.parametrize("device, shape, tflops, tolerance", MEASURED)
def test_profiles_reproduce_what_the_device_measured(device, shape, tflops, tolerance):
    assert achieved(shape, PROFILES[device]) == pytest.approx(tflops * 1e12, rel=tolerance)


# pairs (slower, faster): a shallower k, fewer output tiles than SMs, a padded edge tile
SLOWER_THAN = [
    ((1, 8192, 8192, 64), (1, 8192, 8192, 768)),
    ((1, 8192, 8192, 768), (1, 8192, 8192, 8192)),
    ((1, 128, 128, 8192), (1, 8192, 8192, 8192)),
    ((1, 1024, 1024, 8192), (1, 2048, 2048, 8192)),
    ((1, 8192, 1025, 8192), (1, 8192, 1024, 8192)),
    ((1, 64, 64, 4096), (32, 64, 64, 4096)),
]


@pytest.mark.parametrize("slower, faster", SLOWER_THAN)
def test_small_and_skinny_gemms_run_slower(slower, faster):
    assert achieved(slower) < achieved(faster)


def test_one_output_tile_fills_one_sm_of_132():
    assert achieved((1, 128, 128, 8192)) == pytest.approx(achieved((1, 8192, 8192, 8192)) / 132, rel=0.01)


def test_attention_runs_at_its_share_and_an_unknown_shape_at_the_rate():
    gemm = H100.gemm
    assert gemm.seconds(1e12, BF16, None, attention=False) == pytest.approx(1e12 / 798e12)
    assert gemm.seconds(1e12, BF16, None, attention=True) == pytest.approx(1e12 / (798e12 * 0.28))
    assert gemm.rate("float32") < gemm.rate(BF16)


@pytest.mark.parametrize(
    "bad", [dict(rate_by_dtype=(("bfloat16", 1e12),)), dict(depth_half=-1.0), dict(attention_efficiency=0.0)]
)
def test_a_model_without_a_default_rate_or_with_a_bad_constant_is_refused(bad):
    fields = dict(rate_by_dtype=(("default", 1e12),), depth_half=100.0, **{})
    with pytest.raises(ValueError):
        GemmModel(**{**fields, **bad})


def _node(fn, *shapes, dtype=torch.bfloat16):
    gm = make_fx(fn, tracing_mode="fake")(*(torch.empty(s, dtype=dtype) for s in shapes))
    return next(n for n in gm.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize(
    "fn, shapes, expected",
    [
        (torch.mm, [(64, 32), (32, 16)], GemmShape(1, 64, 16, 32)),
        (torch.bmm, [(4, 64, 32), (4, 32, 16)], GemmShape(4, 64, 16, 32)),
        (lambda b, x, w: torch.addmm(b, x, w), [(16,), (64, 32), (32, 16)], GemmShape(1, 64, 16, 32)),
        (torch.nn.functional.conv2d, [(2, 3, 32, 32), (16, 3, 3, 3)], GemmShape(1, 2 * 30 * 30, 16, 27)),
    ],
)
def test_gemm_shapes_read_off_the_nodes(fn, shapes, expected):
    assert gemm_shape(_node(fn, *shapes, dtype=torch.float32)) == expected


def test_h100_prices_a_shallow_bf16_matmul_above_the_datasheet_and_the_cpu_profile_is_unchanged():
    node = _node(torch.mm, (8192, 768), (768, 2304))
    flops = 2 * 8192 * 768 * 2304
    h100 = compute_node_cost(node, H100)
    assert h100.est_seconds > 1.5 * flops / 989e12  # the datasheet's peak: the cut believed matmuls this cheap
    cpu = compute_node_cost(node, PROFILES["cpu"])
    assert cpu.est_seconds == pytest.approx(flops / PROFILES["cpu"].peak_flops(torch.bfloat16))
