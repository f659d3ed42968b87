"""A joint graph as plain JSON data, and the graph rebuilt from it on any machine: what a recording keeps of the
graph a partitioner received (``fxremat/recording.py``), so that a machine without the recording's GPU can
partition and simulate it again (``benchmarks/gpu_replay.py``).

Per node: its name, op, target (an operator overload ``aten.mm.default`` or a Python function
``_operator.getitem``), its arguments (other nodes by name; numbers, dtypes, devices, layouts, memory formats,
slices) and the meta the partitioners read (``META_KEYS``).  A tensor value is its shape, stride, dtype, device,
storage offset, and its storage (numbered per graph, with its size): rebuilt values of one storage share one fake
storage, as views do.  Dynamic shapes (SymInt values) and graphs with subgraphs are refused with a clear error.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch
import torch.fx as fx

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import recording as tp_recording
from fxremat_passes.graph.ops import overload_named

SCHEMA_VERSION = 1
# The node meta fxremat's passes and PyTorch's partitioner read (docs/DESIGN.md §15); "val" is encoded apart.
META_KEYS = (
    "desc",
    "recompute",
    "ac_graph_id",
    "partitioner_tag",
    "custom",
    "mutation_region_id",
    "autograd_backward",
    "memory_budget",
    "has_backward_hook",
    "saved_tensor_with_no_vc_check",
)
_PLAIN = (bool, int, float, str, type(None))


class UnrecordableGraph(ValueError):
    """A joint graph the recording cannot write down (dynamic shapes, subgraphs, an unknown argument type)."""


def _target_text(node: fx.Node) -> str:
    target = node.target
    if node.op in ("placeholder", "output"):
        return str(target)
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target}"  # aten.mm.default
    if isinstance(target, (types.BuiltinFunctionType, types.FunctionType)):
        return f"py:{target.__module__}.{target.__qualname__}"
    raise UnrecordableGraph(f"cannot record the target of {node.format_node()} (a {type(target).__name__})")


def _target(text: str, op: str):
    if op in ("placeholder", "output"):
        return text
    kind, _, name = text.partition(":")
    if kind == "op":
        return overload_named(name)
    module, _, function = name.rpartition(".")
    return getattr(importlib.import_module(module), function)


def _arg(value: Any, where: fx.Node) -> Any:
    if isinstance(value, fx.Node):
        return {"n": value.name}
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list):
        return [_arg(v, where) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_arg(v, where) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_arg(v, where) for v in (value.start, value.stop, value.step)]}
    raise UnrecordableGraph(f"cannot record an argument of type {type(value).__name__} of {where.format_node()}")


def _decode(data: Any, env: dict[str, fx.Node]) -> Any:
    """An argument as ``_arg`` wrote it, its nodes looked up in ``env``."""
    if isinstance(data, list):
        return [_decode(v, env) for v in data]
    if not isinstance(data, dict):
        return data
    ((kind, inner),) = data.items()
    if kind == "n":
        return env[inner]
    if kind in ("tuple", "slice"):
        items = [_decode(v, env) for v in inner]
        return tuple(items) if kind == "tuple" else slice(*items)
    if kind == "device":
        return torch.device(inner)
    return getattr(torch, inner)  # a dtype, layout or memory format: torch's attribute of that name


class _Storages:
    """Storages numbered in the order values first show them (the same numbering for a graph and its rebuild)."""

    def __init__(self) -> None:
        self.numbers: dict[int, int] = {}

    def number(self, tensor: torch.Tensor) -> int | None:
        try:
            key = tp.storage_identity(tensor)
        except (NotImplementedError, RuntimeError):
            return None
        return self.numbers.setdefault(key, len(self.numbers))


def _tensor_value(value: Any, storages: _Storages, where: fx.Node) -> Any:
    if isinstance(value, torch.Tensor):
        storage = storages.number(value)
        try:
            numel = value.untyped_storage().nbytes() // value.element_size()
        except (NotImplementedError, RuntimeError):
            numel = 0
        shape, stride = list(value.shape), list(value.stride())
        if not all(isinstance(x, int) for x in (*shape, *stride, value.storage_offset())):
            raise UnrecordableGraph(f"dynamic shapes are not recorded: {where.format_node()}")
        dtype = str(value.dtype).removeprefix("torch.")
        return {"t": [shape, stride, dtype, str(value.device), value.storage_offset(), storage, numel]}
    if isinstance(value, (list, tuple)):
        items = [_tensor_value(v, storages, where) for v in value]
        return items if isinstance(value, list) else {"tuple": items}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise UnrecordableGraph(f"dynamic shapes are not recorded: {where.format_node()}")
    if isinstance(value, _PLAIN):
        return value
    return {"repr": repr(value)[:200]}


def _meta_value(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, tp.CheckpointPolicy):
        return {"policy": value.name}
    if type(value).__module__.endswith("descriptors"):
        return {"desc": repr(value)}
    if isinstance(value, (list, tuple)):
        return [_meta_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _meta_value(v) for k, v in value.items()}}
    return {"repr": repr(value)[:200]}


def _meta_from(data: Any) -> Any:
    if isinstance(data, list):
        return [_meta_from(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((kind, inner),) = data.items()
    if kind == "policy":
        return tp.CheckpointPolicy[inner]
    if kind == "desc":
        return tp_recording.descriptor_from_text(inner)
    if kind == "dict":
        return {k: _meta_from(v) for k, v in inner.items()}
    return inner  # a value recorded as its text stays text


def graph_to_dict(gm: fx.GraphModule) -> dict[str, Any]:
    """``gm``'s nodes as plain JSON data (module docstring); ``graph_from_dict`` rebuilds it."""
    storages = _Storages()
    nodes = []
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise UnrecordableGraph(f"cannot record a {node.op} node: {node.format_node()}")
        row: dict[str, Any] = dict(name=node.name, op=node.op, target=_target_text(node))
        row["args"] = _arg(list(node.args), node)
        row["kwargs"] = {k: _arg(v, node) for k, v in node.kwargs.items()}
        if "val" in node.meta:
            row["val"] = _tensor_value(node.meta["val"], storages, node)
        meta = {k: _meta_value(node.meta[k]) for k in META_KEYS if k in node.meta}
        if meta:
            row["meta"] = meta
        nodes.append(row)
    return dict(schema_version=SCHEMA_VERSION, nodes=nodes)


def _fake(data: Any, make, device: str | None) -> Any:
    if isinstance(data, list):
        return [_fake(v, make, device) for v in data]
    if not isinstance(data, dict):
        return data
    ((kind, inner),) = data.items()
    if kind == "tuple":
        return tuple(_fake(v, make, device) for v in inner)
    if kind == "t":
        shape, stride, dtype, recorded_device, offset, storage, numel = inner
        return make(shape, stride, getattr(torch, dtype), device or recorded_device, offset, storage, numel)
    return inner


def graph_from_dict(data: dict[str, Any], device: str | None = None) -> fx.GraphModule:
    """The graph ``graph_to_dict`` wrote, its values fake tensors (no memory) on their recorded device, or on
    ``device`` where given: a CUDA graph is rebuilt as such on a machine without a GPU."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"graph record schema {data.get('schema_version')!r}; this fxremat reads {SCHEMA_VERSION}")
    graph, env = fx.Graph(), {}
    make = tp_recording.fake_tensor_maker()
    for row in data["nodes"]:
        args = _decode(row["args"], env)
        kwargs = {k: _decode(v, env) for k, v in row["kwargs"].items()}
        op = row["op"]
        if op == "placeholder":
            node = graph.placeholder(row["name"])
        elif op == "output":
            node = graph.output(args[0])
        else:
            node = graph.create_node(op, _target(row["target"], op), tuple(args), kwargs, name=row["name"])
        if node.name != row["name"]:
            raise ValueError(f"node {row['name']!r} rebuilt as {node.name!r}")
        env[node.name] = node
        if "val" in row:
            node.meta["val"] = _fake(row["val"], make, device)
        node.meta.update({k: _meta_from(v) for k, v in row.get("meta", {}).items()})
    return fx.GraphModule(torch.nn.Module(), graph)

