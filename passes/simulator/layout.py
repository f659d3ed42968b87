"""What Inductor's layout optimisation does to a split: the memory it adds, and the stride-sensitive reads in backward
that it would silently corrupt (``pin_as_strided_inputs``).

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

from .. import _torch_private as tp
from ..graph.costs import value_nbytes
from ..graph.ops import CLONE, CONVOLUTION, CONVOLUTION_BACKWARD, STRIDE_SENSITIVE, VIEW
from .phase_graph import PhaseGraph


def _weight(node: fx.Node) -> torch.Tensor | None:
    """The weight's value of a convolution (args[1]) or a convolution_backward (args[2])."""
    index = 1 if node.target is CONVOLUTION else 2
    weight = node.args[index] if len(node.args) > index else None
    val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_2d_convolution(node: fx.Node) -> bool:
    weight = _weight(node)
    return weight is not None and weight.dim() == 4


def has_convolution(gm: fx.GraphModule) -> bool:
    return any(n.target is CONVOLUTION for n in gm.graph.nodes)


def layout_optimised(gm: fx.GraphModule) -> bool:
    """Whether Inductor compiles ``gm`` with convolutions in channels-last (False without any convolution)."""
    if not has_convolution(gm):
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


def _weight_gradient_of_2d_convolution(node: fx.Node) -> bool:
    """A ``convolution_backward`` of a 2-D convolution whose output mask asks for the weight gradient."""
    if node.target is not CONVOLUTION_BACKWARD or not _is_2d_convolution(node):
        return False
    output_mask = node.args[-1]
    return isinstance(output_mask, (list, tuple)) and bool(output_mask[1])


def workspace_bytes(node: fx.Node, channels_last: bool) -> int:
    """Bytes an extern kernel allocates and frees inside itself, above its outputs, at its high-water mark, while
    mkldnn's CPU ``convolution_backward`` computes a 2-D weight gradient: channels-last (layout optimisation on),
    two weight-sized copies; contiguous, ``_blocked_reorder_bytes``."""
    if not _weight_gradient_of_2d_convolution(node):
        return 0
    weight = _weight(node)
    if weight.device.type != "cpu":
        return 0
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
    channels, _, kh, kw = _weight(node).shape
    return int(channels * kh * kw) * 1024


def _mkldnn_depthwise_weight_gradient(node: fx.Node) -> bool:
    """A CPU ``convolution_backward`` that asks for the weight gradient of a 2-D depthwise convolution with a kernel
    larger than 3x3: the one mkldnn computes through a large buffer when its input is channels-last."""
    if not _weight_gradient_of_2d_convolution(node) or len(node.args) < 11:
        return False
    weight, groups = _weight(node), node.args[9]
    channels, per_group, kh, kw = weight.shape
    return (
        weight.device.type == "cpu"
        and per_group == 1
        and groups == channels
        and isinstance(kh * kw, int)
        and kh * kw > 9
    )


def convolutions_kept_for_depthwise(joint: fx.GraphModule, candidates) -> dict[fx.Node, str]:
    """The forward convolutions no plan may recompute in a CPU joint graph Inductor will layout-optimise that has an
    mkldnn depthwise weight gradient with a kernel above 3x3, each with the reason (``candidates``: the untagged
    forward nodes the cut decides on).

    Why (docs/DESIGN.md §7; MobileNetV3, EfficientNet): Inductor decides layout optimisation per graph, on whether it
    has a ``convolution`` (``GraphLowering.decide_layout_opt``).  A backward that recomputes one is layout-optimised, so
    its depthwise weight gradients read channels-last inputs and mkldnn allocates ``depthwise_buffer_bytes`` for each,
    larger than the rest of the step's peak on MobileNetV3-Small's 576-channel 5x5 convolution (docs/DESIGN.md §7).  A
    backward with no convolution is not layout-optimised and allocates nothing of the kind (PyTorch's split saves every
    convolution's output).  Saving a convolution's output costs its bytes; at the issue's batch (2x3x64x64) the buffer
    is larger than any activation of
    these nets."""
    if not any(_mkldnn_depthwise_weight_gradient(n) for n in joint.graph.nodes) or not layout_optimised(joint):
        return {}
    largest = max(depthwise_buffer_bytes(n) for n in joint.graph.nodes)
    reason = (
        "a convolution: recomputed in backward it would make mkldnn's depthwise weight gradients allocate up to "
        f"{largest / 2**20:.1f} MiB (issue #19)"
    )
    return {n: reason for n in candidates if n.target is CONVOLUTION}


def _restridable_inputs(bw: fx.GraphModule) -> list[fx.Node]:
    """Backward's saved-tensor placeholders: the inputs whose strides AOTAutograd replaces with the strides the
    compiled forward actually returned (``graph_compile.py``: ``_aot_stage2b_bw_compile`` restrides them from
    ``fwd_output_strides``).  Tangents and seeds keep their traced strides."""
    return [
        n
        for n in bw.graph.find_nodes(op="placeholder")
        if isinstance(n.meta.get("val"), torch.Tensor) and not tp.is_tangent(n) and not tp.is_bwd_seed_offset(n)
    ]


def _like(val: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty_like(val, memory_format=memory_format)
    with mode:
        return torch.empty_like(val, memory_format=memory_format)


def pin_as_strided_inputs(bw: fx.GraphModule) -> int:
    """Make backward's ``as_strided`` reads independent of the layout its saved inputs arrive in; returns how many
    it pinned.

    Why (docs/DESIGN.md §7; GroupNorm conv nets): ``as_strided(x, size, stride)`` reads ``x``'s storage, so its result
    depends on ``x``'s strides.  The joint graph was traced with ``x`` contiguous.  But Inductor's forward may return
    a saved tensor in another layout (channels-last under layout optimisation; padded strides), AOTAutograd then
    restrides backward's placeholder to match, and Inductor re-runs fake-tensor propagation on backward
    (``compile_fx.py``: ``fake_tensor_prop`` after ``view_to_reshape``), so every pointwise value computed from
    that input in backward takes its layout too, and an ``as_strided`` on one of them reads its elements in
    another order: wrong values, no error.  GroupNorm's decomposition computes its scale as ``as_strided(rsqrt *
    weight.view(1, G, C/G, 1), (N, C), (C, 1))``: saving the 4-D weight view (channels-last in a layout-optimised
    forward) permuted every GroupNorm scale in backward.

    The fix keeps the traced meaning: where ``x`` was traced contiguous, it reads ``clone(x, contiguous)``, whose
    layout no input can change, with the storage offset made relative to the clone.  Inductor realises an
    ``as_strided`` input as a buffer anyway, so a clone of a computed value costs nothing (it is that buffer); a
    clone of a placeholder costs one copy of it.  Only reads that depend on a saved input are pinned."""
    restridable = set(_restridable_inputs(bw))
    if not restridable:
        return 0
    depends = set(restridable)
    pinned = 0
    for node in list(bw.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in STRIDE_SENSITIVE and node.args and node.args[0] in depends:
            pinned += _pin(bw.graph, node)
        if any(arg in depends for arg in node.all_input_nodes):
            depends.add(node)
    if pinned:
        bw.recompile()
    return pinned


def _pin(graph: fx.Graph, node: fx.Node) -> int:
    """Read ``node``'s first input through a contiguous clone, if the traced input was contiguous."""
    source = node.args[0]
    val = source.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_contiguous():
        return 0  # traced in a layout a clone cannot rebuild: left as traced
    offset_index = 3 if node.target is STRIDE_SENSITIVE[0] else 4
    args = list(node.args)
    offset = args[offset_index] if len(args) > offset_index else node.kwargs.get("storage_offset")
    base_offset = val.storage_offset()
    if offset is not None and base_offset != 0 and not (isinstance(offset, int) and isinstance(base_offset, int)):
        return 0  # a symbolic offset into a view: left as traced
    with graph.inserting_before(node):
        clone = graph.call_function(CLONE, (source,), {"memory_format": torch.contiguous_format})
    clone.meta = {**source.meta, "val": _like(val, torch.contiguous_format)}
    args[0] = clone
    if offset is not None and base_offset != 0:
        # relative to the traced input's first element, which is the clone's storage offset 0
        if len(args) > offset_index:
            args[offset_index] = offset - base_offset
        else:
            node.kwargs = {**node.kwargs, "storage_offset": offset - base_offset}
    node.args = tuple(args)
    return 1


# meta key of the flat views ``saved_inputs_as_views`` adds to forward (no plan chose to save them)
SAVED_INPUT_VIEW = "fxremat_saved_input_view"


def saved_inputs_as_views(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Make forward save a flat view of each input Inductor would otherwise save as its channels-last copy, and
    backward view it back; returns how many.

    Why (docs/DESIGN.md §7): under layout optimisation Inductor wants every 4-D value read by a convolution in
    channels-last (``GraphLowering.find_nodes_prefer_channels_last``, which includes the placeholders of weights and
    images), and a graph output of such a value gets channels-last strides (``GraphLowering.run_node``: ``is_output``
    and ``n in self.nodes_prefer_channels_last``).  A placeholder has fixed strides, so a saved weight is returned as a
    copy, made once at forward's start, and the copy is kept until backward: on ResNet-18 the weight copies are many
    times the saved activations (docs/DESIGN.md §7).  A saved flat view is no value a convolution reads: its strides
    stay ``(1,)``, Inductor returns ``reinterpret_tensor(primals_k, ...)``, and autograd keeps the parameter's own
    storage.  Forward's convolutions still read channels-last copies, made beside each one and freed after it; backward
    makes its own copy before its first reader (``_view_back``).  Inductor removes a view that keeps the shape
    (``post_grad.py``: ``remove_noop_ops``), hence the flat one.  Symbolic shapes: left alone.

    Only for graphs Inductor compiles: eager kernels (aot_eager, no-op compilers) get no copies to avoid, and the
    channels-last weight would make channels-last gradients meet contiguous saved activations there (measured on
    example("groupnorm_convnet") with no-op compilers: every gradient from the first GroupNorm backward on wrong)."""
    copies = channels_last_copies(fw)
    if not copies:
        return 0
    outputs = list(fw.graph.output_node().args[0])
    saved = outputs[num_fwd_outputs:]
    tensors = [i for i, n in enumerate(saved) if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"][len(saved) - len(tensors) :]
    order = {node: i for i, node in enumerate(bw.graph.nodes)}
    done = 0
    for index, bw_input in zip(tensors, placeholders):
        value = saved[index]
        if value.op != "placeholder" or value.name not in copies or not _flat_viewable(value.meta["val"]):
            continue
        if any(user.target not in (CONVOLUTION, CONVOLUTION_BACKWARD) for user in bw_input.users):
            continue  # backward reads it otherwise too (an ``as_strided`` would read the channels-last copy's order)
        outputs[num_fwd_outputs + index] = _flat_view(fw.graph, value)
        _view_back(bw.graph, bw_input, order)
        done += 1
    if done:
        fw.graph.output_node().args = (tuple(outputs),)
        fw.recompile()
        bw.recompile()
    return done


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
    return _flat_viewable(value.meta["val"]) and all(r.target in convolutions for r in bw_readers)


def _flat_viewable(val: torch.Tensor) -> bool:
    return val.is_contiguous() and all(isinstance(s, int) for s in val.shape)


def _flat_view(graph: fx.Graph, value: fx.Node) -> fx.Node:
    """``view(value, [numel])``, just before forward's output."""
    val = value.meta["val"]
    with graph.inserting_before(graph.output_node()):
        flat = graph.call_function(VIEW, (value, [val.numel()]))
    flat.meta = {**value.meta, "val": val.view(-1), SAVED_INPUT_VIEW: True}
    return flat


def _view_back(graph: fx.Graph, placeholder: fx.Node, order: dict[fx.Node, int]) -> None:
    """Backward's ``placeholder`` becomes the flat view; its readers read it viewed back to its traced shape and
    copied to channels-last, just before the first of them: the layout the forward's copy had, so backward computes
    as it did (a convolution it recomputes, and what follows it, stay channels-last: read contiguous, they went
    contiguous and took an activation-sized copy more on example("convnet")), and the copy is made where it is
    needed, not kept from forward."""
    val = placeholder.meta["val"]
    placeholder.meta = {**placeholder.meta, "val": val.view(-1)}
    if not placeholder.users:
        return
    with graph.inserting_before(min(placeholder.users, key=order.__getitem__)):
        shaped = graph.call_function(VIEW, (placeholder, list(val.shape)))
        copy = graph.call_function(CLONE, (shaped,), {"memory_format": torch.channels_last})
    placeholder.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not shaped)
    shaped.meta = {**placeholder.meta, "val": val}
    copy.meta = {**placeholder.meta, "val": _like(val, torch.channels_last)}
