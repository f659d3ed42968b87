"""The torch releases fxremat supports and what differs between them: plain flags, read by ``_torch_private``'s
modules and, through it, by the passes (each difference: ``tests/passes/test_torch_versions.py``)."""

from __future__ import annotations

import re

import torch

# The torch releases whose private partitioner helpers we have tested against (pyproject pins the same range).
SUPPORTED_TORCH = ((2, 11), (2, 12), (2, 13), (2, 14))


def torch_version_tuple(version: str | None = None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    if not match:
        return (0, 0)
    return (int(match.group(1)), int(match.group(2)))


def unsupported_torch_reason(version: str | None = None) -> str | None:
    """None if this torch is one we test; otherwise a sentence saying why fxremat will step aside."""
    found = torch_version_tuple(version)
    if found in SUPPORTED_TORCH:
        return None
    allowed = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_TORCH)
    return (
        f"fxremat is tested with torch {allowed}; found {version or torch.__version__}. "
        "Using PyTorch's default partitioner instead."
    )


# --- what differs between the releases we support (each difference: tests/passes/test_torch_versions.py) ---------
TORCH = torch_version_tuple()
# 2.12 renamed the no-guard hint ``size_hint`` to ``optimization_hint``, gave the extraction a ``saved_opaque_nodes``
# argument, and snapshots each output's stack trace on the output node (``output_stack_traces``, read by Inductor)
OPAQUE_NODES_AND_OUTPUT_TRACES = TORCH >= (2, 12)
# 2.13 added ``region_activation_memory_budget``, an ``fx.traceback.annotate`` of this key (made before 2.13 by
# ``region_memory_budget`` in knobs.py, and read the same way)
MEMORY_BUDGET_ANNOTATION_KEY = "_region_activation_memory_budget"
# Inductor's decompositions: an embedding's gradient is one ``_unsafe_masked_index_put_accumulate`` from 2.13
# (before: an ``index_put`` in the joint graph); from 2.12 a ``bmm`` that is an outer product (K = 1) is a broadcast
# multiply (before: an extern bmm, whose output exists whole)
EMBEDDING_GRAD_SCATTER = (
    torch.ops.aten._unsafe_masked_index_put_accumulate.default if TORCH >= (2, 13) else torch.ops.aten.index_put.default
)
BMM_OUTER_PRODUCT_IS_POINTWISE = TORCH >= (2, 12)
# 2.13: on a GPU Inductor lowers a dot-shaped ``bmm`` to a multiply and a sum (``lowering._bmm_is_reduction``), and
# the extraction marks each backward op ``meta["autograd_backward"]`` (split.py marks them where PyTorch does)
GPU_DOT_BMM_IS_REDUCTION = BACKWARD_OPS_MARKED = TORCH >= (2, 13)
# 2.13 only: a C++ fusion step loses mutation renames (``inductor_keeps_mutation_order``; 2.14 re-applies them)
SCHEDULER_DROPS_MUTATION_RENAMES = TORCH == (2, 13)
