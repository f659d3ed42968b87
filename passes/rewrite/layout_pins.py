"""The layout pins fxremat hands Inductor with a split it lays out: backward's ``as_strided`` reads made independent
of the layout its saved inputs arrive in (``pin_as_strided_inputs``), and saved inputs handed over as flat views
rather than as Inductor's channels-last copies (``saved_inputs_as_views``; the simulator reads what it does through
``simulator/layout.py``'s ``recopied_saved_inputs``).  docs/DESIGN.md §7."""

from __future__ import annotations

import torch
import torch.fx as fx

from .. import _torch_private as tp
from ..graph.ops import CLONE, CONVOLUTION, CONVOLUTION_BACKWARD, STRIDE_SENSITIVE, VIEW
from ..simulator.inputs import inputs_for
from ..simulator.layout import SAVED_INPUT_VIEW, channels_last_copies, flat_viewable


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


def saved_inputs_as_views(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs=None) -> int:
    """Make forward save a flat view of each input Inductor would otherwise save as its channels-last copy, and
    backward view it back; returns how many.  ``inputs``: the ``SimulatorInputs`` of the layout Inductor gets
    (``LayoutChoice.simulator_inputs``; by default Inductor's defaults for ``fw``'s device).

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
    copies = channels_last_copies(fw, inputs_for(fw, inputs))
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
        if value.op != "placeholder" or value.name not in copies or not flat_viewable(value.meta["val"]):
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
