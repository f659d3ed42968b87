"""The seam between the simulator and Inductor's code-generation backends: ``SchedulingRules``, what one backend
does differently from another where the step's memory depends on it.  The simulator's stages (``lowering.py``,
``fusion.py``, ``phase.py``, ``walk.py``, ``layout.py``) read a node's facts and the graph, and ask the rules of
the backend they simulate (``SimulatorInputs.backend``, ``simulator/inputs.py``) whatever depends on the backend;
none of them tests a device.  One module per backend: ``cpp.py`` (Inductor's C++ backend, checked against real
compiles) and ``triton.py`` (its Triton backend for GPUs, not yet checked against a recorded GPU compile); a backend
is registered by name in ``backends/__init__.py`` (``BACKENDS``), as ``solver/solvers.py`` registers solvers.
docs/DESIGN.md §6 (the simulator) says what each rule models; docs/ARCHITECTURE.md where a new rule goes.

The schedule's seam (docs/DESIGN.md §6, "The schedule's seam"): the simulated schedule is an ordered list of kernels
on one stream; an offload's copies run on a second stream (``transfer.py``, DESIGN §16), priced by the backend's
``transfer_seconds`` (None where the backend has no offload).  A subgraph node (``invoke_subgraph``, PyTorch's
chunking) is one extern-like unit whose own schedule the rules will simulate as a nested phase (not built).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.fx as fx

if TYPE_CHECKING:  # the inputs hold a backend's rules
    from .inputs import SimulatorInputs

# The most reads any backend's realization rule compares a count of loads with (the C++ backend's
# ``max_reads``): ``access.add_loads`` keeps one more than that.
MOST_READS_COMPARED = 12


class FusionVetoes:
    """A backend's own refusals of fusions that the simulator's common rules (``fusion.Fusion.fuse``) would make, for
    one phase's fusion: asked before each merge (``refuses``: ``fusion`` is the ``Fusion``, ``ga`` and ``gb`` two of
    its groups), told of each merge (``merged``).  This base refuses none."""

    def refuses(self, fusion, ga: fx.Node, gb: fx.Node) -> bool:
        return False

    def merged(self, ga: fx.Node, gb: fx.Node) -> None:
        """``gb``'s group has merged into ``ga``'s."""


class SchedulingRules:
    """One backend's rules.  Attributes are facts of the backend; methods answer for one node or kernel."""

    name: str = ""
    # checked against that backend's real compiles (tests and benchmarks say which); False: a model from its source
    validated: bool = False
    # ``IRNode.has_exceeded_max_reads``: a pointwise value reading more buffers than this is stored (realized)
    max_reads: int = 8
    # ``StorageBox.should_realize_on_reuse``: a value read by several nodes whose computation is costly (exp, log,
    # sigmoid, tanh) is stored rather than computed in each reader
    realizes_costly_on_reuse: bool = False
    # ``lowering.cat``: every ``cat`` lowers to a ConcatKernel, a buffer its inputs' kernels write into
    cat_is_concat_kernel: bool = False
    # ``should_prefer_unfused_addmm``: ``add(mm, c)`` whose readers are all pointwise stays an mm and a fused add
    keeps_mm_before_pointwise_readers: bool = False
    # a reduction's loop runs over its kept dims, then its reduced ones, never reordered to match its producer's
    # (``ComputedBuffer.simplify_and_reorder``): it reads a stored value laid out otherwise at another index
    # (``access.another_index``), so never fuses into that value's kernel (``fusion.Fusion.reads_at_another_index``)
    reduction_loop_order_fixed: bool = False
    # generated kernels run in groups that free what they read only when the group is flushed (``walk.Walk``)
    groups_generated_kernels: bool = False
    # fxremat hands this backend a backward reordered for fewer compile units (``rewrite/cpp_units.py``)
    joins_kernel_runs: bool = False

    def __init__(self, torch_version: tuple[int, int]) -> None:
        self.torch_version = torch_version  # the release whose Inductor the rules describe

    def __repr__(self) -> str:
        return f"{type(self).__name__}(torch {self.torch_version[0]}.{self.torch_version[1]})"

    def allocated_bytes(self, nbytes: int) -> int:
        """What the device's allocator counts for a tensor of ``nbytes``."""
        return nbytes

    def bmm_is_reduction(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether Inductor lowers ``bmm(a, b)`` to a multiply and a sum (a reduction kernel)."""
        return False

    def fusion_vetoes(self, phase, fusible: list[fx.Node]) -> FusionVetoes:
        """The backend's refusals of fusions among ``fusible``, the units of ``phase`` (a ``phase._Phase``) that are
        its own kernels."""
        return FusionVetoes()

    def transfer_seconds(self, nbytes: int, link_bandwidth: float | None) -> float | None:
        """Seconds one copy of ``nbytes`` takes over the host link (DESIGN §16), or None where this backend has no
        offload (PyTorch's offload ops need a device with pinned host memory and streams)."""
        return None

    def workspace_bytes(self, node: fx.Node, channels_last: bool) -> int:
        """Bytes an extern kernel allocates and frees inside itself, above its outputs, while it runs."""
        return 0

    def depthwise_buffer_bytes(self, node: fx.Node) -> int:
        """A buffer a depthwise convolution's weight gradient allocates inside itself from a channels-last input."""
        return 0

    def convolutions_kept(self, joint: fx.GraphModule, candidates, inputs: SimulatorInputs) -> dict[fx.Node, str]:
        """Forward convolutions no plan may recompute on this backend (``inputs``: the partition's simulator
        inputs), each with the reason."""
        return {}
