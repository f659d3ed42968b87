"""Inductor's Triton backend (GPUs) as the simulator sees it.  **Not yet validated** against a recorded GPU compile:
each rule is read from Inductor's source for torch 2.11-2.14 (named beside it); the GPU recordings replayed on CPU
are to check them (docs/DESIGN.md §6).  Where this module says nothing, the simulator's common rules apply: SIMD
fusion of kernels whose loops have the same size, each kernel freeing what it read last right after it runs."""

from __future__ import annotations

import torch
import torch.fx as fx

from ... import _torch_private as tp
from ..rules import FusionVetoes, SchedulingRules

# The CUDA caching allocator hands out blocks in multiples of 512 bytes (c10/cuda/CUDACachingAllocator.cpp:
# ``kMinBlockSize``, ``round_size``), and ``torch.cuda.max_memory_allocated`` counts the rounded blocks.
CUDA_BLOCK_BYTES = 512
# ``tuned_bmm`` (torch 2.13 on): a dot-shaped bmm of these dtypes and a short enough K becomes a multiply and a sum,
# "so surrounding operations can fuse instead of dispatching a tiny extern bmm"
_DOT_BMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DOT_BMM_MAX_K = 32


class TritonRules(SchedulingRules):
    name = "triton"
    validated = False
    max_reads = 8  # ``StorageBox.has_exceeded_max_reads``: ``config._realize_acc_reads_threshold_default``
    keeps_mm_before_pointwise_readers = True  # ``should_prefer_unfused_addmm``

    def __init__(self, torch_version: tuple[int, int]) -> None:
        super().__init__(torch_version)
        # 2.13 added the dot-shaped bmm lowering (``_torch_private.versions.GPU_DOT_BMM_IS_REDUCTION``)
        self.dot_bmm_is_reduction = torch_version >= (2, 13)

    def transfer_seconds(self, nbytes: int, link_bandwidth: float | None) -> float | None:
        """A copy on PyTorch's one transfer stream at the profile's host link (DESIGN §16)."""
        return None if link_bandwidth is None else nbytes / link_bandwidth

    def allocated_bytes(self, nbytes: int) -> int:
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES if nbytes > 0 else nbytes

    def bmm_is_reduction(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """From torch 2.13, where M and N are both 1 (by their hints), the dtypes agree and K is not known to exceed
        32 (a symbolic K counts as not known); both operands on the same kind of device."""
        if not self.dot_bmm_is_reduction or a.device.type != b.device.type:
            return False
        m, n, k = a.shape[1], b.shape[2], a.shape[2]
        dot_shaped = tp.size_hint(m) == 1 and tp.size_hint(n) == 1
        short = isinstance(k, torch.SymInt) or k <= _DOT_BMM_MAX_K
        return dot_shaped and a.dtype == b.dtype and a.dtype in _DOT_BMM_DTYPES and short

    def fusion_vetoes(self, phase, fusible: list[fx.Node]) -> FusionVetoes:
        """None (not yet validated against Triton).  ``SIMDScheduling.can_fuse`` fuses a reduction and a pointwise
        kernel in either order (it swaps them), so the C++ backend's reduction-first veto has no counterpart; its
        size and tiling refusals (numel/rnumel, ``tiling_prevents_pointwise_fusion``) are left to the simulator's
        common rules (``fusion.py``: fused units' loops match)."""
        return FusionVetoes()
