"""Inductor's C++ backend (CPU) as the simulator sees it: each rule checked against real compiles on CPU (the tests
named beside each, and ``benchmarks/investigations/``).  docs/DESIGN.md §6."""

from __future__ import annotations

import torch
import torch.fx as fx

from ..rules import MOST_READS_COMPARED, FusionVetoes, SchedulingRules
from .cpp_fusion import CppFusionVetoes
from .mkldnn import convolutions_kept_for_depthwise, depthwise_buffer_bytes, workspace_bytes


class CppRules(SchedulingRules):
    name = "cpp"
    validated = True
    max_reads = MOST_READS_COMPARED  # ``config.realize_cpu_acc_reads_threshold`` (tests/passes/test_realize_reads.py)
    realizes_costly_on_reuse = True  # tests/passes/test_realize_reads.py
    # ``lowering.cat``: "if cpu_device: return ConcatKernel.create" (tests/passes/test_concat_scatter.py)
    cat_is_concat_kernel = True
    # the C++ backend never reorders a loop to match another node's (tests/passes/test_fusion_index.py)
    reduction_loop_order_fixed = True
    # ``Scheduler.codegen`` flushes the backend's ``KernelGroup`` before an extern kernel
    # (tests/passes/test_liveness.py)
    groups_generated_kernels = True
    joins_kernel_runs = True  # tests/passes/test_cpp_units.py

    def bmm_is_reduction(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """``kernel/bmm.py`` on CPU: M == 1 or N == 1 (every release we support)."""
        return a.shape[1] == 1 or b.shape[2] == 1

    def fusion_vetoes(self, phase, fusible: list[fx.Node]) -> FusionVetoes:
        # tests/passes/test_fusion_drag.py (a reduction first), tests/passes/test_cpp_loops.py (loop sizes)
        return CppFusionVetoes.of(phase, fusible)

    def workspace_bytes(self, node: fx.Node, channels_last: bool) -> int:
        return workspace_bytes(node, channels_last)  # mkldnn's convolution backward (tests/passes/test_liveness.py)

    def depthwise_buffer_bytes(self, node: fx.Node) -> int:
        return depthwise_buffer_bytes(node)  # tests/passes/test_layout_depthwise.py

    def convolutions_kept(self, joint: fx.GraphModule, candidates, inputs) -> dict[fx.Node, str]:
        return convolutions_kept_for_depthwise(joint, candidates, inputs)
