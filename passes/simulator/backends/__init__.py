"""Inductor's code-generation backends as the simulator sees them: ``BACKENDS``, each backend's ``SchedulingRules`` by
name (``simulator/rules.py`` is the interface; ``cpp.py`` and ``triton.py`` the rules), and ``backend_for_device``, the
one place a device type chooses a backend.  Whoever starts a simulation says which backend it simulates
(``simulator/inputs.py``): a plan for a GPU is computed on a machine without one."""

from __future__ import annotations

import functools

import torch
import torch.fx as fx

from ... import _torch_private as tp
from ..rules import SchedulingRules
from .cpp import CppRules
from .triton import TritonRules

BACKENDS: dict[str, type[SchedulingRules]] = {CppRules.name: CppRules, TritonRules.name: TritonRules}
# Inductor's backend for each device type (``codegen/common.py``: ``register_backend_for_device``)
DEVICE_BACKENDS = {"cpu": CppRules.name, "cuda": TritonRules.name, "xpu": TritonRules.name}


@functools.lru_cache(maxsize=None)
def backend_rules(name: str, torch_version: tuple[int, int] = tp.TORCH) -> SchedulingRules:
    """The rules of backend ``name`` under a torch release (the running one by default; a recorded graph's own)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown Inductor backend {name!r}; one of {sorted(BACKENDS)}")
    return BACKENDS[name](torch_version)


def backend_for_device(device_type: str, torch_version: tuple[int, int] = tp.TORCH) -> SchedulingRules:
    """The rules of the backend Inductor generates code with for ``device_type`` ("cpu", "cuda", ...)."""
    return backend_rules(DEVICE_BACKENDS.get(device_type, TritonRules.name), torch_version)


def device_type_of_graph(gm: fx.GraphModule) -> str:
    """The device type of the graph's first tensor value ("cpu" for a graph with none): the device Inductor
    generates the graph's code for."""
    return device_type_of(gm.graph.nodes)


def device_type_of(nodes) -> str:
    """``device_type_of_graph`` of a graph's nodes (an ``fx.Graph``'s, or a view's)."""
    for node in nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device.type
    return "cpu"
