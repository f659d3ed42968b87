"""mkldnn's convolution backward on CPU, as the C++ backend's rules price it (``cpp.py``): the weight-sized buffers
it allocates and frees inside itself while it returns a 2-D weight gradient (``workspace_bytes``), the large buffer
of a depthwise weight gradient from a channels-last input (``depthwise_buffer_bytes``), and the convolutions a CPU
joint graph may therefore never recompute (``convolutions_kept_for_depthwise``).  docs/DESIGN.md §7."""

from __future__ import annotations

import torch
import torch.fx as fx

from ...graph.costs import value_nbytes
from ...graph.ops import CONVOLUTION, CONVOLUTION_BACKWARD
from ..layout import conv_weight, is_2d_convolution, layout_optimised


def _weight_gradient_of_2d_convolution(node: fx.Node) -> bool:
    """A ``convolution_backward`` of a 2-D convolution whose output mask asks for the weight gradient."""
    if node.target is not CONVOLUTION_BACKWARD or not is_2d_convolution(node):
        return False
    output_mask = node.args[-1]
    return isinstance(output_mask, (list, tuple)) and bool(output_mask[1])


def workspace_bytes(node: fx.Node, channels_last: bool) -> int:
    """Bytes an extern kernel allocates and frees inside itself, above its outputs, at its high-water mark, while
    mkldnn's CPU ``convolution_backward`` computes a 2-D weight gradient: channels-last (layout optimisation on),
    two weight-sized copies; contiguous, ``_blocked_reorder_bytes``."""
    if not _weight_gradient_of_2d_convolution(node):
        return 0
    weight = conv_weight(node)
    return 2 * value_nbytes(weight) if channels_last else _blocked_reorder_bytes(node, weight)


def _blocked_reorder_bytes(node: fx.Node, weight: torch.Tensor) -> int:
    """Contiguous tensors (fxremat's CPU compiles, ``FxrematBackend._layout_patches``): mkldnn reorders the input and
    the output gradient to its blocked layout for the weight gradient, or the weight when that is larger; a 1x1
    kernel takes a matmul path without either, a depthwise kernel above 3x3 another (measured op by op with the CPU
    profiler; docs/DESIGN.md §7)."""
    kh, kw = weight.shape[2:]
    if not isinstance(kh * kw, int) or kh * kw == 1 or _mkldnn_depthwise_weight_gradient(node):
        return 0
    activations = [a.meta.get("val") for a in node.args[:2] if isinstance(a, fx.Node)]
    if not all(isinstance(a, torch.Tensor) for a in activations):
        return 0
    return max(sum(value_nbytes(a) for a in activations), value_nbytes(weight))


def depthwise_buffer_bytes(node: fx.Node) -> int:
    """The buffer mkldnn allocates while it computes a depthwise weight gradient with a kernel above 3x3 from a
    channels-last input: out channels x kh x kw x 1 KiB, at any batch, image size or thread count (none for 3x3, none
    from a contiguous input; measured op by op, docs/DESIGN.md §7).  Inductor hands that op a channels-last input
    whenever the graph is layout-optimised (``kernel/conv.py``: ``convolution_backward`` lowering,
    ``require_channels_last`` when the weight gradient is asked), i.e. when backward recomputes a convolution."""
    if not _mkldnn_depthwise_weight_gradient(node):
        return 0
    channels, _, kh, kw = conv_weight(node).shape
    return int(channels * kh * kw) * 1024


def _mkldnn_depthwise_weight_gradient(node: fx.Node) -> bool:
    """A CPU ``convolution_backward`` that asks for the weight gradient of a 2-D depthwise convolution with a kernel
    larger than 3x3: the one mkldnn computes through a large buffer when its input is channels-last."""
    if not _weight_gradient_of_2d_convolution(node) or len(node.args) < 11:
        return False
    weight, groups = conv_weight(node), node.args[9]
    channels, per_group, kh, kw = weight.shape
    return (
        per_group == 1
        and groups == channels
        and isinstance(kh * kw, int)
        and kh * kw > 9
    )


def convolutions_kept_for_depthwise(joint: fx.GraphModule, candidates, inputs) -> dict[fx.Node, str]:
    """The forward convolutions no plan may recompute in a CPU joint graph Inductor will layout-optimise (under the
    simulator's ``inputs``) that has an mkldnn depthwise weight gradient with a kernel above 3x3, each with the reason
    (``candidates``: the untagged forward nodes the cut decides on).

    Why (docs/DESIGN.md §7; MobileNetV3, EfficientNet): Inductor decides layout optimisation per graph, on whether it
    has a ``convolution`` (``GraphLowering.decide_layout_opt``).  A backward that recomputes one is layout-optimised, so
    its depthwise weight gradients read channels-last inputs and mkldnn allocates ``depthwise_buffer_bytes`` for each,
    larger than the rest of the step's peak on MobileNetV3-Small's 576-channel 5x5 convolution (docs/DESIGN.md §7).  A
    backward with no convolution is not layout-optimised and allocates nothing of the kind (PyTorch's split saves every
    convolution's output).  Saving a convolution's output costs its bytes; at the issue's batch (2x3x64x64) the buffer
    is larger than any activation of
    these nets."""
    if not any(_mkldnn_depthwise_weight_gradient(n) for n in joint.graph.nodes) or not layout_optimised(joint, inputs):
        return {}
    largest = max(depthwise_buffer_bytes(n) for n in joint.graph.nodes)
    reason = (
        "a convolution: recomputed in backward it would make mkldnn's depthwise weight gradients allocate up to "
        f"{largest / 2**20:.1f} MiB (issue #19)"
    )
    return {n: reason for n in candidates if n.target is CONVOLUTION}
