"""What Inductor's layout optimisation does to a split: the memory it adds, and the stride-sensitive reads in backward
that it would silently corrupt (``pin_as_strided_inputs``).

When a graph has 2-D convolutions and mkldnn is available, Inductor compiles it with ``layout_opt`` (its own
decision, ``GraphLowering.decide_layout_opt``, asked through ``_torch_private`` under the switches the simulator's
inputs carry).  Two things follow that no partitioner sees, both measured on ``example("convnet")`` (CPU profiler
memory events, one step):

* Channels-last copies of graph inputs.  The convolution lowering requires its input and weight in channels-last
  (``kernel/conv.py``: ``require_channels_last``); a placeholder has fixed (contiguous) strides, so forward copies
  it (``cpp_fused_0(primals_1, primals_2, primals_8, buf0, buf1, buf2)``, before the first convolution) and every
  later use in that graph reads the copy, including forward's outputs: a placeholder saved for backward is handed
  over as the copy (backward's ``primals_1`` arrives with strides ``(27, 1, 9, 3)``) and held until its last use
  there.  The parameters and user inputs themselves stay alive in the caller (not counted, as before).
* The weight gradient of a convolution comes back through copies: mkldnn's ``convolution_backward`` computes it
  into oneDNN's buffer, converts it to a dense tensor (``aten::empty``) and, for channels-last tensors, to
  channels-last (``aten::to``): two weight-sized buffers above the returned gradient, freed before the op returns.
  On the convnet that is the step's peak (measured +9216 +9216 +9216 -9216 -9216 inside ``buf10``'s
  ``convolution_backward`` for conv2's 9216-byte weight).

Not modelled: oneDNN's scratchpad and weight reorders inside a convolution (8216-8344 B and one weight size on the
convnet, freed inside the op; their size depends on the algorithm oneDNN picks), and channels-last copies of
intermediate values whose layout Inductor cannot choose (it makes the producer write channels-last instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .. import _torch_private as tp
from ..graph.costs import value_nbytes
from ..graph.ops import CONVOLUTION, CONVOLUTION_BACKWARD
from .phase_graph import PhaseGraph

if TYPE_CHECKING:  # the inputs' module loads the backends, whose rules read this one
    from .inputs import SimulatorInputs


def conv_weight(node: fx.Node) -> torch.Tensor | None:
    """The weight's value of a convolution (args[1]) or a convolution_backward (args[2])."""
    index = 1 if node.target is CONVOLUTION else 2
    weight = node.args[index] if len(node.args) > index else None
    val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def is_2d_convolution(node: fx.Node) -> bool:
    weight = conv_weight(node)
    return weight is not None and weight.dim() == 4


def has_convolution(gm: fx.GraphModule) -> bool:
    return any(n.target is CONVOLUTION for n in gm.graph.nodes)


def layout_optimised(gm: fx.GraphModule, inputs: SimulatorInputs) -> bool:
    """Whether Inductor compiles ``gm`` with convolutions in channels-last (False without any convolution): its own
    decision, replayed from what ``inputs`` say it reads besides the graph (``SimulatorInputs``), never from its live
    config (docs/DESIGN.md §6.0)."""
    if not has_convolution(gm) or not inputs.layout_optimisation:
        return False
    return tp.inductor_layout_optimisation(
        gm,
        layout_optimization=inputs.layout_optimisation,
        force_layout_optimization=inputs.forces_layout_optimisation,
        mkldnn_enabled=inputs.mkldnn_enabled,
    )


def channels_last_copies(fw: fx.GraphModule, inputs: SimulatorInputs) -> dict[str, int]:
    """Forward's placeholders that Inductor copies to channels-last (name -> bytes of the copy): those read as the
    input or the weight of a 2-D convolution in a layout-optimised forward (under ``inputs``), unless already
    channels-last."""
    if not layout_optimised(fw, inputs):
        return {}
    copies: dict[str, int] = {}
    for node in fw.graph.nodes:
        if node.target is not CONVOLUTION or not is_2d_convolution(node):
            continue
        for arg in node.args[:2]:
            val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
            if arg.op != "placeholder" or not isinstance(val, torch.Tensor):
                continue
            if not val.is_contiguous(memory_format=torch.channels_last):
                copies[arg.name] = value_nbytes(val)
    return copies


# meta key of the flat views ``saved_inputs_as_views`` adds to forward (no plan chose to save them)
SAVED_INPUT_VIEW = "fxremat_saved_input_view"


def recopied_saved_inputs(fw: PhaseGraph, bw: PhaseGraph, num_fwd_outputs: int, copies: dict[str, int]) -> tuple:
    """What ``saved_inputs_as_views`` does (or did) to a split, for the simulator: (forward's saved values that keep
    no channels-last copy alive for backward, {backward input: bytes of the copy backward makes before its first
    reader}).  A built split already rewritten saves flat views (``SAVED_INPUT_VIEW``) and makes its copies in its
    own graph (no backward entries); a split not yet rewritten (a plan's, before the compile) is read as it will be."""
    saved = fw.returned_args[num_fwd_outputs:]
    tensors = [n for n in saved if isinstance(n.meta.get("val"), torch.Tensor)]
    bw_inputs = [n for n in bw.nodes if n in bw.inputs][len(saved) - len(tensors) :]
    recopied: set[fx.Node] = set()
    arrivals: dict[str, int] = {}
    for value, bw_input in zip(tensors, bw_inputs):
        if value.meta.get(SAVED_INPUT_VIEW):
            recopied.add(value)
        elif value in fw.inputs and value.name in copies and _recopiable(value, bw.users(bw_input)):
            recopied.add(value)
            arrivals[bw_input.name] = copies[value.name]
    return frozenset(recopied), arrivals


def _recopiable(value: fx.Node, bw_readers) -> bool:
    """The condition ``saved_inputs_as_views`` rewrites a saved input under."""
    convolutions = (CONVOLUTION, CONVOLUTION_BACKWARD)
    return flat_viewable(value.meta["val"]) and all(r.target in convolutions for r in bw_readers)


def flat_viewable(val: torch.Tensor) -> bool:
    return val.is_contiguous() and all(isinstance(s, int) for s in val.shape)
