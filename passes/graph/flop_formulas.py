"""FLOP counts of the kernels FlopCounterMode does not count, or counts differently across the torch releases
fxremat supports, from plain shapes: ``ops.FLOP_FORMULAS`` applies them to nodes (docs/DESIGN.md §4.1)."""

from __future__ import annotations

import math


def grouped_mm_flops(a_shape, b_shape, out_shape) -> int:
    """``aten._grouped_mm`` (MoE experts), which FlopCounterMode does not count: 2 FLOPs per multiply-add.  The
    groups (``offs``) partition one dimension, so the count needs shapes only: in a 2-D by 2-D product the groups
    split the contraction (the weight gradient: each group sums over its own rows), otherwise each output element
    is one dot product over the last dimension of ``a``.  Rows past ``offs[-1]`` are counted too (none in MoE)."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(out_shape) * a_shape[-1]


def sdpa_flops(q_shape, k_shape, v_shape) -> int:
    """Attention's two products, 2 FLOPs per multiply-add, every query head counted: with grouped-query attention
    (key and value with fewer heads) the kernel broadcasts their heads.  FlopCounterMode's count from torch 2.13; its
    2.11 formula asserts on grouped-query shapes, so fxremat counts attention itself on every release."""
    b, h, s_q, d_q = q_shape
    s_k, d_v = k_shape[2], v_shape[3]
    return 2 * b * h * s_q * s_k * (d_q + d_v)


def sdpa_backward_flops(q_shape, k_shape, v_shape) -> int:
    """Attention's backward (FlopCounterMode's five products from torch 2.13: the scores recomputed, the gradients of
    the scores, of value, of query and of key), every query head counted."""
    b, h, s_q, d_q = q_shape
    s_k, d_v = k_shape[2], v_shape[3]
    return 2 * b * h * s_q * s_k * (3 * d_q + 2 * d_v)
