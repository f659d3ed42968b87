"""Matmul-class kernels at the throughput a device achieves, by shape (docs/DESIGN.md §4.2): ``GemmModel``.

A GEMM of ``batch`` products of ``m x k`` by ``k x n`` runs at

    rate(dtype) * depth(k) * padding(m, n) * fill(batch, m, n)

* ``rate``: what a large GEMM achieves, measured at ``k = REFERENCE_DEPTH`` (an 8192-cube);
* ``depth(k) = [k / (k + depth_half)] / [REFERENCE_DEPTH / (REFERENCE_DEPTH + depth_half)]``: each output tile pays
  a fixed pipeline fill and epilogue, amortised over its k loop, so a shallow GEMM runs slower;
* ``padding``: the useful share of the ``tile x tile`` output tiles (the rest is padding);
* ``fill = min(1, tiles / units)``: with fewer output tiles than compute units (SMs) the rest idle.

Wave quantisation is left out: cuBLAS picks among tile shapes and splits k, so a fixed tile's waves mispredict it.
Attention kernels (flash, efficient, cuDNN) run at ``attention_efficiency`` of ``rate``.  Plain numbers: the graph
tier (``costs.py``) reads the shapes off the nodes (``gemm_shape``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.fx as fx

from .. import _torch_private as tp
from .ops import CONVOLUTION_BACKWARD, CONVOLUTION_OPS, GEMM_OPERANDS, get_arg, packet

# The depth of the GEMM a profile's ``rate`` was measured at (an 8192-cube; GPU_NOTES "What is known about the GPU").
REFERENCE_DEPTH = 8192


@dataclass(frozen=True)
class GemmShape:
    """``batch`` products of ``m x k`` by ``k x n`` (a convolution as its implicit GEMM)."""

    batch: int
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class GemmModel:
    """Achieved throughput of matmul-class kernels by shape (module docstring).  ``rate_by_dtype``: FLOP/s of a
    large GEMM per dtype name (key "default" for the rest); ``depth_half``: the k at which the per-tile overhead
    equals the k loop; ``units``: compute units (SMs); ``tile``: output tile edge."""

    rate_by_dtype: tuple[tuple[str, float], ...]
    depth_half: float
    units: int = 1
    tile: int = 1
    attention_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not any(k == "default" for k, _ in self.rate_by_dtype):
            raise ValueError("GemmModel.rate_by_dtype needs a 'default' entry")
        if any(v <= 0 or not math.isfinite(v) for _, v in self.rate_by_dtype):
            raise ValueError("GemmModel rates must be positive FLOP/s")
        if self.depth_half < 0 or self.units < 1 or self.tile < 1 or not 0 < self.attention_efficiency <= 1:
            raise ValueError("GemmModel: depth_half >= 0, units >= 1, tile >= 1, 0 < attention_efficiency <= 1")

    def rate(self, dtype_name: str | None) -> float:
        table = dict(self.rate_by_dtype)
        return table.get(dtype_name or "default", table["default"])

    def efficiency(self, shape: GemmShape | None) -> float:
        """The share of ``rate`` a GEMM of ``shape`` achieves (1 where the shape is unknown)."""
        if shape is None:
            return 1.0
        h = self.depth_half
        depth = (shape.k / (shape.k + h)) / (REFERENCE_DEPTH / (REFERENCE_DEPTH + h)) if shape.k > 0 else 1.0
        rows, cols = math.ceil(shape.m / self.tile), math.ceil(shape.n / self.tile)
        padding = shape.m * shape.n / (rows * cols * self.tile**2) if rows * cols else 1.0
        fill = min(1.0, shape.batch * rows * cols / self.units)
        return depth * padding * fill

    def seconds(self, flops: float, dtype_name: str | None, shape: GemmShape | None, attention: bool) -> float:
        efficiency = self.attention_efficiency if attention else self.efficiency(shape)
        return flops / (self.rate(dtype_name) * efficiency)


def _dims(node: fx.Node, index: int) -> tuple[int, ...]:
    return tuple(tp.size_hint(s) for s in node.args[index].meta["val"].shape)


def gemm_shape(node: fx.Node) -> GemmShape | None:
    """The GEMM a matmul or convolution node runs (None where unknown: ``GemmModel`` then prices it at ``rate``)."""
    try:
        pkt = packet(node)
        operands = GEMM_OPERANDS.get(pkt)
        if operands is not None:
            a, b = _dims(node, operands[0]), _dims(node, operands[1])
            batch = math.prod(a[:-2]) if len(a) > 2 else 1
            return GemmShape(batch, a[-2], b[-1], a[-1])
        if pkt in CONVOLUTION_OPS:
            # the forward's implicit GEMM; its backward's two GEMMs have the same dimensions
            out = _dims(node, 0) if node.target is CONVOLUTION_BACKWARD else None
            weight = _dims(node, 2 if node.target is CONVOLUTION_BACKWARD else 1)
            if out is None:
                out = tuple(tp.size_hint(s) for s in node.meta["val"].shape)
            groups = get_arg(node, "groups", 1) or 1
            spatial = math.prod(out[2:])
            return GemmShape(groups, out[0] * spatial, weight[0] // groups, math.prod(weight[1:]))
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    return None
