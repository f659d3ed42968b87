"""What a recording of a compile (``fxremat/recording.py``) reads of PyTorch's private state, and what a replay
rebuilds from it: the kernels Inductor's scheduler emits with the FX nodes each came from, Inductor's and
functorch's config, AOTAutograd's descriptors from their text, fake tensors standing for recorded values, and the
CUDA caching allocator's history.  Tests: tests/passes/test_recording.py and tests/benchmarks/test_gpu_replay.py."""

from __future__ import annotations

import ast
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from torch._inductor.scheduler import Scheduler
from torch._inductor.virtualized import V

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_unrecorded_codegen = None
_PLAIN = (bool, int, float, str, type(None))


def record_inductor_schedules(sink: Callable[[], Callable[[dict], None] | None]) -> None:
    """From now on, each ``Scheduler.codegen`` first hands ``sink()`` (where it is not None) the kernels it is
    about to emit (``scheduled_kernels``).  Installed once, process-wide; with ``sink()`` None it costs one call."""
    global _unrecorded_codegen
    with _LOCK:
        if _unrecorded_codegen is not None:
            return
        unrecorded = Scheduler.codegen

        def codegen_recorded(self):
            take = sink()
            if take is not None:
                try:
                    take(scheduled_kernels(self))
                except Exception as error:  # a recording must never break a compile
                    log.warning("fxremat: Inductor's schedule not recorded: %s", error, exc_info=True)
            return unrecorded(self)

        _unrecorded_codegen = unrecorded
        Scheduler.codegen = codegen_recorded


def scheduled_kernels(scheduler) -> dict[str, Any]:
    """The scheduler's nodes in the order they are emitted, after fusion and reordering: per kernel its kind
    (the scheduler node's class), the FX nodes it came from (``origins``, in the lowered graph's order) and the
    buffers it writes (name, bytes, the FX node whose value it holds)."""
    graph = V.graph
    module = getattr(graph, "module", None)
    place = {n.name: i for i, n in enumerate(module.graph.nodes)} if isinstance(module, torch.fx.GraphModule) else {}
    kernels = []
    for node in scheduler.nodes:
        members = node.get_nodes()
        origins = {o.name for m in members if getattr(m, "node", None) is not None for o in m.node.origins}
        kernels.append(
            dict(
                name=node.get_name(),
                kind=type(node).__name__,
                origins=sorted(origins, key=lambda name: (place.get(name, len(place)), name)),
                outputs=[[b.get_name(), _buffer_bytes(b), _origin(b)] for m in members for b in m.get_outputs()],
            )
        )
    return dict(
        backward=bool(getattr(graph, "is_backward", False)),
        graph_id=str(getattr(graph, "graph_id", None)),
        lowered_nodes=len(place),
        kernels=kernels,
    )


def _origin(buf) -> str | None:
    node = getattr(getattr(buf, "node", None), "origin_node", None)
    return None if node is None else node.name


def _buffer_bytes(buf) -> int | None:
    try:
        ir, sizes = buf.node, V.graph.sizevars
        hint = getattr(sizes, "optimization_hint", None) or sizes.size_hint  # renamed in torch 2.13
        return int(hint(ir.get_numel(), fallback=0)) * ir.get_dtype().itemsize
    except Exception:  # a buffer without a size (a mutation's alias, a multi-output tuple): unknown
        return None


def config_snapshot() -> dict[str, dict[str, Any]]:
    """Inductor's and functorch's config as it is now (patches in force included): plain values as they are, the
    rest as their text (``{"repr": ...}``), which a replay does not restore."""

    def plain(value):
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
            return list(value)
        return {"repr": repr(value)[:200]}

    return {
        "inductor": {k: plain(v) for k, v in sorted(inductor_config.get_config_copy().items())},
        "functorch": {k: plain(v) for k, v in sorted(functorch_config.get_config_copy().items())},
    }


@contextlib.contextmanager
def config_restored(snapshot: dict[str, dict[str, Any]]):
    """Inductor's and functorch's config patched to a ``config_snapshot``'s numbers and switches (bool, int,
    float) where this torch knows the name: what a partition reads of them on the recording machine.  Yields the
    names of the recording this torch does not know."""
    unknown = []
    patches = []
    for section, module in (("inductor", inductor_config), ("functorch", functorch_config)):
        known = module.get_config_copy()
        changes = {}
        for name, value in snapshot.get(section, {}).items():
            if name not in known:
                unknown.append(f"{section}.{name}")
            elif isinstance(value, (bool, int, float)) and known[name] != value:
                changes[name] = value
        patches.append(module.patch(changes))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield unknown


def descriptor_from_text(text: str):
    """An AOTAutograd descriptor (``PlainAOTInput(idx=0)``, ``GradAOTOutput(grad_of=...)``) from its ``repr``:
    calls of the descriptor classes with constant or descriptor arguments, nothing else evaluated."""
    from torch._functorch._aot_autograd import descriptors

    classes = {k: v for k, v in vars(descriptors).items() if isinstance(v, type)}

    def build(node: ast.AST):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            values = [build(e) for e in node.elts]
            return values if isinstance(node, ast.List) else tuple(values)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
            args = [build(a) for a in node.args]
            return classes[node.func.id](*args, **{k.arg: build(k.value) for k in node.keywords})
        raise ValueError(f"not an AOTAutograd descriptor: {text!r}")

    return build(ast.parse(text, mode="eval").body)


def fake_tensor_maker():
    """A function ``make(shape, stride, dtype, device, offset, storage, storage_numel)`` of fake tensors (no
    memory, any device, a CUDA one included on a machine without one): values of one recorded ``storage`` (a key)
    share one fake storage, as views of one tensor do."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    bases: dict[Any, torch.Tensor] = {}

    def make(shape, stride, dtype: torch.dtype, device: str, offset: int, storage, storage_numel: int):
        with mode:
            base = bases.get((storage, dtype))
            if base is None:
                base = torch.empty_strided((max(storage_numel, 1),), (1,), dtype=dtype, device=device)
                if storage is not None:
                    bases[(storage, dtype)] = base
            return base.as_strided(tuple(shape), tuple(stride), offset)

    return make


@contextlib.contextmanager
def cuda_memory_history(max_entries: int = 500_000):
    """The CUDA caching allocator's history recorded meanwhile (allocations with their Python stacks); read it
    with ``cuda_memory_snapshot`` before leaving."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=max_entries)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def cuda_memory_snapshot() -> dict:
    """The allocator's snapshot (``torch.cuda.memory._snapshot``): its ``device_traces`` hold the history."""
    return torch.cuda.memory._snapshot()
