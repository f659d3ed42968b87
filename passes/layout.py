"""What Inductor's layout optimisation adds to a split's memory, after partitioning (CPU, torch 2.13).

When a graph has 2-D convolutions and mkldnn is available, Inductor compiles it with ``layout_opt`` (its own
decision, ``GraphLowering.decide_layout_opt``, asked through ``_torch_private``).  Two things follow that no
partitioner sees, both measured on ``example("convnet")`` (CPU profiler memory events, one step):

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

import torch
import torch.fx as fx

from . import _torch_private as tp
from .costs import value_nbytes

CONVOLUTION = torch.ops.aten.convolution.default
CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default


def _weight(node: fx.Node) -> torch.Tensor | None:
    """The weight's value of a convolution (args[1]) or a convolution_backward (args[2])."""
    index = 1 if node.target is CONVOLUTION else 2
    weight = node.args[index] if len(node.args) > index else None
    val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_2d_convolution(node: fx.Node) -> bool:
    weight = _weight(node)
    return weight is not None and weight.dim() == 4


def layout_optimised(gm: fx.GraphModule) -> bool:
    """Whether Inductor compiles ``gm`` with convolutions in channels-last (False without any convolution)."""
    if not any(n.target is CONVOLUTION for n in gm.graph.nodes):
        return False
    return tp.inductor_layout_optimisation(gm)


def channels_last_copies(fw: fx.GraphModule) -> dict[str, int]:
    """Forward's placeholders that Inductor copies to channels-last (name -> bytes of the copy): those read as the
    input or the weight of a 2-D convolution in a layout-optimised forward, unless already channels-last."""
    if not layout_optimised(fw):
        return {}
    copies: dict[str, int] = {}
    for node in fw.graph.nodes:
        if node.target is not CONVOLUTION or not _is_2d_convolution(node):
            continue
        for arg in node.args[:2]:
            val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
            if arg.op != "placeholder" or not isinstance(val, torch.Tensor):
                continue
            if not val.is_contiguous(memory_format=torch.channels_last):
                copies[arg.name] = value_nbytes(val)
    return copies


def workspace_bytes(node: fx.Node, channels_last: bool) -> int:
    """Bytes an extern kernel allocates and frees inside itself, above its outputs, at its high-water mark: the
    weight gradient's two copies in mkldnn's channels-last ``convolution_backward``.  Without channels-last (layout
    optimisation off) mkldnn first reorders the input and the output gradient (two activation-sized buffers,
    measured eagerly): not modelled, Inductor runs CPU convolutions channels-last."""
    if not channels_last or node.target is not CONVOLUTION_BACKWARD or not _is_2d_convolution(node):
        return 0
    output_mask = node.args[-1]
    if not (isinstance(output_mask, (list, tuple)) and output_mask[1]):
        return 0
    weight = _weight(node)
    return 2 * value_nbytes(weight) if weight.device.type == "cpu" else 0
