"""PyTorch's activation-offload rewrite, driven on fxremat's chosen values (docs/DESIGN.md §16).

PyTorch runs ``torch._functorch._activation_offloading`` only inside its own partitioner, on the values a user
tagged.  ``rewrite_offloads`` runs it on a split fxremat made, for the saved values it names:

* torch 2.13 and later: ``offload_chosen_sets_async`` (``ao::offload`` + ``ao::wait_tensor`` after the value's last
  forward use; ``ao::reload`` + ``ao::wait_tensor`` before its first backward use), then each offload's wait is
  moved to the forward node the schedule chose (``transfer.py``) and each reload to the backward node it chose;
* torch 2.11: ``offload_chosen_sets`` (``prims.device_put`` each way, synchronous: the stream variant,
  ``put_offload_nodes_on_separate_stream``, is not driven yet).

``offload_unavailable`` says why the running torch cannot, or None.  PyTorch's rewrite refuses views, ``getitem``s
and non-contiguous tensors (``can_offload``): so does ``rewrite_offloads``, by name, before touching the graphs.
"""

from __future__ import annotations

import importlib
import operator

import torch
import torch.fx as fx

from ..graph.ops import OpClass, op_class

_MODULE = "torch._functorch._activation_offloading.activation_offloading"


def _machinery():
    try:
        return importlib.import_module(_MODULE)
    except ImportError:
        return None


def offload_unavailable() -> str | None:
    """None where this torch has an offload rewrite fxremat drives, else why not."""
    module = _machinery()
    if module is None:
        return f"this torch ({torch.__version__}) has no activation offloading ({_MODULE})"
    if not (hasattr(module, "offload_chosen_sets_async") or hasattr(module, "offload_chosen_sets")):
        return f"this torch ({torch.__version__}) has neither offload_chosen_sets_async nor offload_chosen_sets"
    return None


def is_async() -> bool:
    """Whether the rewrite uses the ``ao`` ops (torch 2.13 and later) rather than ``prims.device_put``."""
    return hasattr(_machinery(), "offload_chosen_sets_async")


def refusal(node: fx.Node) -> str | None:
    """Why PyTorch's rewrite cannot offload ``node`` (its ``can_offload`` rules), or None."""
    if node.op != "call_function":
        return "not computed in forward"
    if op_class(node) is OpClass.VIEW or node.target is operator.getitem:
        return "a view or item: its base is offloaded instead"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_contiguous():
        return "not a contiguous tensor"
    return None


def offload_follows(node: fx.Node) -> fx.Node:
    """The node PyTorch's rewrite issues ``node``'s offload after: its last reader in graph order, through views
    as PyTorch's op list names them (``_find_all_effective_users``), else ``node`` itself.  The offload's wait can
    be moved only to a node after it (``_move_waits``)."""
    from torch._functorch.partitioners import get_default_op_list

    is_view, readers, stack = get_default_op_list().is_view, set(), [node]
    while stack:
        for user in stack.pop().users:
            if user.op != "output" and user not in readers:
                readers.add(user)
                if is_view(user):
                    stack.append(user)
    position = {n: i for i, n in enumerate(node.graph.nodes)}
    return max(readers, key=position.__getitem__, default=node)


def reload_precedes(placeholder: fx.Node) -> fx.Node | None:
    """The node PyTorch's rewrite puts a backward input's reload and its wait before: its first reader in graph
    order (None where nothing reads it).  The reload can be moved only to it or a node before it
    (``_move_reloads``)."""
    position = {n: i for i, n in enumerate(placeholder.graph.nodes)}
    return min(placeholder.users, key=position.__getitem__, default=None)


def rewrite_offloads(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    names: list[str],
    waits: dict[str, str] | None = None,
    reloads: dict[str, str] | None = None,
) -> None:
    """Offloads the saved values ``names`` of the split (fw, bw) with PyTorch's rewrite (module docstring).
    ``waits``: value -> the forward node its offload's wait goes before ("" for the forward's end); ``reloads``:
    value -> the backward node its reload is issued before.  Raises ValueError naming a value it cannot offload."""
    reason = offload_unavailable()
    if reason is not None:
        raise ValueError(f"fxremat cannot offload: {reason}")
    saved = {n.name: n for n in fw.graph.output_node().args[0] if isinstance(n, fx.Node)}
    for name in names:
        why = "not saved for backward" if name not in saved else refusal(saved[name])
        if why is not None:
            raise ValueError(f"fxremat cannot offload {name}: {why}")
        saved[name].meta["saved_for_offloading"] = True
        saved[name].meta["original_device"] = saved[name].meta["val"].device
    module = _machinery()
    if is_async():
        module.offload_chosen_sets_async(fw, bw)
        _move_waits(fw, waits or {})
        _move_reloads(bw, reloads or {})
    else:
        module.offload_chosen_sets(fw, bw)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()


def _move_waits(fw: fx.GraphModule, waits: dict[str, str]) -> None:
    """Each offload's ``ao.wait_tensor`` moved before the node named (the output where ""), never before its
    offload."""
    nodes = {n.name: n for n in fw.graph.nodes}
    for value, before in waits.items():
        wait = nodes[f"{_machinery().CPU_OFFLOAD_PREFIX}{value}"]
        target = nodes[before] if before else fw.graph.output_node()
        _check_order(fw, wait.args[0], target, f"the wait of {value}'s offload")
        target.prepend(wait)


def _move_reloads(bw: fx.GraphModule, reloads: dict[str, str]) -> None:
    """Each ``ao.reload`` moved before the node named, never after its wait (which stays before the first use);
    named its first use (``reload_precedes``), it stays where the rewrite put it, just before its wait there."""
    nodes = {n.name: n for n in bw.graph.nodes}
    for value, before in reloads.items():
        reload = nodes[f"async_{_machinery().GPU_RELOAD_PREFIX}{value}"]
        wait = next(iter(reload.users))
        position = {n: i for i, n in enumerate(bw.graph.nodes)}
        if nodes[before] is min(wait.users, key=position.__getitem__, default=None):
            continue
        _check_order(bw, nodes[before], wait, f"the reload of {value}", wait=True)
        if nodes[before] is not reload:
            nodes[before].prepend(reload)


def _check_order(gm: fx.GraphModule, first: fx.Node, then: fx.Node, what: str, wait: bool = False) -> None:
    """Raises where ``first`` stands after ``then``: a wait's target (``then``) before its offload (``first``), or
    (``wait``) a reload's target (``first``) after the reload's wait (``then``)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    if position[first] > position[then]:
        if wait:
            raise ValueError(f"fxremat cannot issue {what} before {first.name}: it stands after the wait {then.name}")
        raise ValueError(f"fxremat cannot place {what} before {then.name}: it would precede {first.name}")
