"""annotate_costs: a ``NodeCost`` per node (bytes, FLOPs, bytes moved, estimated seconds on a ``DeviceProfile``).

One ``node.meta`` key (``COST_KEY``), one reader (``node_cost``, which computes the cost of a node the pass was
not asked to annotate: the partition annotates only the values its cut decides on).  Sizes are read through size
hints, never by comparing SymInts (that installs guards and recompiles).

Fusion rule, in one place (``recompute_seconds``): a view, pointwise, copy or creation op is assumed to fuse into
its consumer, so recomputing it costs its FLOPs only, no memory traffic; every other op runs as its own kernel and
costs ``max(flops / peak, bytes_moved / bandwidth)`` (a roofline).  Saving a value costs a read in backward, plus
a write in forward when its producer would otherwise have stayed inside a fused kernel (``save_traffic_bytes``).
Justification: the project's first weighted cut (this rule, with these CPU constants, beat PyTorch's cut on every
model tried); the cost-model issue replaces the constants with measured ones.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.fx as fx
import torch.utils.flop_counter as flop_counter

from .. import _torch_private as tp
from .gemm_rates import GemmModel, GemmShape, gemm_shape
from .ops import (
    COMPUTE_BOUND,
    FLOP_FORMULAS,
    FUSIBLE,
    PARTIAL_READ_OPS,
    POINTWISE_FLOP_WEIGHTS,
    POINTWISE_WEIGHT_RULES,
    OpClass,
    op_class,
    packet,
    qualified_name,
)

if TYPE_CHECKING:
    from .graph_facts import GraphFacts

log = logging.getLogger(__name__)

COST_KEY = "fxremat_cost"
SYMBOLIC_VALUE_BYTES = 8  # a SymInt/SymFloat kept for backward: tiny, but not free


@dataclass(frozen=True)
class DeviceProfile:
    """What one device can do: peak FLOP/s per dtype name (key "default" for the rest) and memory bandwidth
    in bytes/s; ``gemm``: the achieved throughput of matmul-class kernels by shape (``gemm_rates.GemmModel``), or
    None to price them at ``peak_flops`` like every other op; ``host_link_bandwidth``: bytes/s one way between
    device and pinned host memory, or None where offload has no link (docs/DESIGN.md §16)."""

    name: str
    peak_flops_by_dtype: tuple[tuple[str, float], ...]
    mem_bandwidth: float
    gemm: GemmModel | None = None
    host_link_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.mem_bandwidth <= 0 or not math.isfinite(self.mem_bandwidth):
            raise ValueError(f"DeviceProfile {self.name!r}: mem_bandwidth must be a positive number of bytes/s")
        link = self.host_link_bandwidth
        if link is not None and (link <= 0 or not math.isfinite(link)):
            raise ValueError(f"DeviceProfile {self.name!r}: host_link_bandwidth must be a positive number of bytes/s")
        if not any(k == "default" for k, _ in self.peak_flops_by_dtype):
            raise ValueError(f"DeviceProfile {self.name!r}: peak_flops_by_dtype needs a 'default' entry")
        for k, v in self.peak_flops_by_dtype:
            if v <= 0 or not math.isfinite(v):
                raise ValueError(f"DeviceProfile {self.name!r}: peak FLOP/s for {k} must be positive")

    def peak_flops(self, dtype: torch.dtype | None) -> float:
        return _peak_flops(self.peak_flops_by_dtype, dtype)

    def seconds(self, flops: float, bytes_moved: float, dtype: torch.dtype | None) -> float:
        return max(flops / self.peak_flops(dtype), bytes_moved / self.mem_bandwidth)

    def kernel_seconds(
        self, flops: float, bytes_moved: float, dtype: torch.dtype | None, shape: GemmShape | None, attention: bool
    ) -> float:
        """A matmul-class kernel's roofline: its FLOPs at ``gemm``'s achieved rate for its shape."""
        if self.gemm is None:
            return self.seconds(flops, bytes_moved, dtype)
        name = str(dtype).removeprefix("torch.") if dtype is not None else None
        return max(self.gemm.seconds(flops, name, shape, attention), bytes_moved / self.mem_bandwidth)


@functools.lru_cache(maxsize=256)
def _peak_flops(peak_flops_by_dtype: tuple, dtype: torch.dtype | None) -> float:
    table = dict(peak_flops_by_dtype)
    key = str(dtype).removeprefix("torch.") if dtype is not None else "default"
    return table.get(key, table["default"])


# Hopper's matmul-class kernels (docs/DESIGN.md §4.2).  depth_half: fitted so that a 768-deep GEMM runs at 595/798
# of the 8192-cube's rate (GPT-2's 768-deep bf16 addmms on the project's H100, benchmarks/gpu_check.py); 132
# SMs (H100/H200 SXM), 128-wide output tiles; attention: cuDNN flash attention in the same kernel profile
# (benchmarks/results/gpu_check_gpt2/prof_*.txt: GPT-2's head dim 64, causal) ran ~230 TFLOP/s forward and ~215
# backward of the FLOPs counted (FlopCounterMode counts the masked half too), against 798: 0.28.
HOPPER_DEPTH_HALF = 300.0
HOPPER_ATTENTION_EFFICIENCY = 0.28


def _hopper(bf16_rate: float, float32_rate: float) -> GemmModel:
    rates = (("default", float32_rate), ("float32", float32_rate), ("bfloat16", bf16_rate), ("float16", bf16_rate))
    return GemmModel(rates, HOPPER_DEPTH_HALF, units=132, tile=128, attention_efficiency=HOPPER_ATTENTION_EFFICIENCY)


# Fixed constants, not measurements of this machine, so that the same graph gives the same cut everywhere.
# CPU: the prototype's constants, no shape model.  GPUs: ``peak_flops_by_dtype`` the datasheet's dense peaks (the
# FLOP term of everything but matmul-class kernels); ``gemm`` what a large bf16 GEMM achieved, measured (fp32: the
# datasheet's non-tensor peak, not measured); ``mem_bandwidth`` a measured device-to-device copy (read + written)
# where one was measured; ``host_link_bandwidth`` one direction of the host link (docs/DESIGN.md §16): PCIe Gen5 x16
# at PyTorch's assumed 50 GB/s (``activation_offload_cpu_gpu_bw``; the datasheet's 64), Gen4 x16 at half that,
# NVLink-C2C at the datasheet's 450 GB/s per direction.
PCIE_GEN5_X16 = 50e9
PCIE_GEN4_X16 = 25e9
NVLINK_C2C = 450e9
PROFILES: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile("cpu", (("default", 50e9),), 10e9),
    # A100 SXM: bf16 GEMM 267.9 TFLOP/s measured (Maximum Achievable Matmul FLOPS table, stas00/ml-engineering
    # compute/accelerator/README.md, CUDA 12.1, best shape 6912x16384x2048); 108 SMs; Hopper's depth_half and
    # attention share assumed (not measured on an A100); bandwidth: the datasheet's 2.039 TB/s (not measured)
    "a100": DeviceProfile(
        "a100",
        (("default", 19.5e12), ("float32", 19.5e12), ("bfloat16", 312e12), ("float16", 312e12)),
        2.039e12,
        GemmModel(
            (("default", 19.5e12), ("float32", 19.5e12), ("bfloat16", 267.9e12), ("float16", 267.9e12)),
            HOPPER_DEPTH_HALF,
            units=108,
            tile=128,
            attention_efficiency=HOPPER_ATTENTION_EFFICIENCY,
        ),
        PCIE_GEN4_X16,
    ),
    # H100 80GB HBM3 (the project's GPU machine, GPU_NOTES): an 8192-cube bf16 matmul ~798 TFLOP/s, a device copy
    # ~3.0 TB/s
    "h100": DeviceProfile(
        "h100",
        (("default", 67e12), ("float32", 67e12), ("bfloat16", 989e12), ("float16", 989e12)),
        3.0e12,
        _hopper(798e12, 67e12),
        PCIE_GEN5_X16,
    ),
    # H200 (the project's GPU machine, GPU_NOTES): ~788 TFLOP/s, a device copy ~4.3 TB/s
    "h200": DeviceProfile(
        "h200",
        (("default", 67e12), ("float32", 67e12), ("bfloat16", 989e12), ("float16", 989e12)),
        4.3e12,
        _hopper(788e12, 67e12),
        PCIE_GEN5_X16,
    ),
    # GH200: H100's compute figures (assumed, not measured on a GH200), HBM3's datasheet 4.0 TB/s, NVLink-C2C
    "gh200": DeviceProfile(
        "gh200",
        (("default", 67e12), ("float32", 67e12), ("bfloat16", 989e12), ("float16", 989e12)),
        4.0e12,
        _hopper(798e12, 67e12),
        NVLINK_C2C,
    ),
}


@dataclass(frozen=True)
class NodeCost:
    """Costs of one node.  ``nbytes``: its output (tuple items summed); ``storage_nbytes``: the storage that saving
    it keeps alive (its alias root's; 0 for views of graph inputs); ``bytes_moved``: read + written as its own
    kernel; ``est_seconds``: roofline time as its own kernel; ``recompute_seconds``: under the fusion rule."""

    op_class: OpClass
    nbytes: int
    storage_nbytes: int
    alias_root: str
    flops: int
    bytes_moved: int
    est_seconds: float
    recompute_seconds: float
    save_traffic_bytes: int
    dtype: str | None = field(default=None)


def node_cost(node: fx.Node, profile: DeviceProfile) -> NodeCost:
    """The one reader of ``COST_KEY``; computes the cost of a node the annotation pass never saw (e.g. one a
    partitioner created)."""
    cost = node.meta.get(COST_KEY)
    return cost if cost is not None else compute_node_cost(node, profile)


# --- sizes -------------------------------------------------------------------------------------------------------


def value_nbytes(val) -> int:
    if isinstance(val, torch.Tensor):
        return tp.size_hint(val.numel()) * val.element_size()
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
        return SYMBOLIC_VALUE_BYTES
    if isinstance(val, (tuple, list)):
        return sum(value_nbytes(v) for v in val)
    return 0


def symbolic_nbytes(val) -> str:
    """Output bytes as an expression of the graph's size symbols, e.g. ``4*s0*768`` (for reports)."""
    if isinstance(val, torch.Tensor):
        numel = val.numel()
        expr = numel.node.expr if isinstance(numel, torch.SymInt) else numel
        return str(expr * val.element_size())
    return str(value_nbytes(val))


def first_tensor(value):
    """The first tensor in ``value``, depth first through tuples, lists and dicts (a node's value, or a model's
    output: a transformers ModelOutput is a dict)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def _tensor_dtype(val) -> torch.dtype | None:
    tensor = first_tensor(val)
    return None if tensor is None else tensor.dtype


def alias_root(node: fx.Node, classes: dict[fx.Node, OpClass] | None = None) -> fx.Node:
    """The node owning the storage that ``node`` aliases (follows views, and items of view tuples like split)."""
    seen = 0
    while seen < 10_000:
        seen += 1
        cls = classes[node] if classes is not None and node in classes else op_class(node)
        if cls is OpClass.VIEW and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        if cls is OpClass.GETITEM:
            parent = node.args[0]
            parent_cls = classes[parent] if classes is not None and parent in classes else op_class(parent)
            if parent_cls is OpClass.VIEW and parent.args and isinstance(parent.args[0], fx.Node):
                node = parent.args[0]
                continue
        return node
    return node


# --- FLOPs -------------------------------------------------------------------------------------------------------


def _as_meta(arg):
    """Replace FakeTensors by meta tensors of hinted shapes, SymInts by hints (FlopCounter formulas need shapes)."""
    if isinstance(arg, fx.Node):
        arg = arg.meta.get("val")
    if isinstance(arg, torch.Tensor):
        return torch.empty([tp.size_hint(s) for s in arg.shape], dtype=arg.dtype, device="meta")
    if isinstance(arg, torch.SymInt):
        return tp.size_hint(arg)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_as_meta(a) for a in arg)
    return arg


def _meta_key(arg):
    """What ``_as_meta`` keeps of an argument (hinted shapes, dtypes, constants), as a hashable key."""
    if isinstance(arg, fx.Node):
        arg = arg.meta.get("val")
    if isinstance(arg, torch.Tensor):
        return (torch.Tensor, tuple(tp.size_hint(s) for s in arg.shape), arg.dtype)
    if isinstance(arg, torch.SymInt):
        return tp.size_hint(arg)
    if isinstance(arg, (list, tuple)):
        return (type(arg), tuple(_meta_key(a) for a in arg))
    return (type(arg), arg)


# FLOP formulas are pure functions of what ``_as_meta`` passes them, and a model repeats the same shapes block after
# block: their results by (op, ``_meta_key`` of every argument), cleared past this many entries.
FORMULA_CACHE_SIZE = 4096
_FORMULA_FLOPS: dict = {}


def _formula_key(pkt, node: fx.Node):
    key = (
        pkt,
        _meta_key(tuple(node.args)),
        tuple((k, _meta_key(v)) for k, v in node.kwargs.items()),
        _meta_key(node.meta.get("val")),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def hinted_shape(arg) -> tuple[int, ...]:
    """A node's (or a tensor's) shape in plain ints (symbolic sizes at their hints)."""
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    return tuple(tp.size_hint(s) for s in val.shape)


def hinted_numel(val) -> int:
    """Elements of a value (a tuple's summed), symbolic sizes at their hints."""
    if isinstance(val, torch.Tensor):
        return tp.size_hint(val.numel())
    if isinstance(val, (tuple, list)):
        return sum(hinted_numel(v) for v in val)
    return 0


def _first_tensor_input(node: fx.Node):
    for a in node.all_input_nodes:
        if isinstance(a.meta.get("val"), torch.Tensor):
            return a.meta["val"]
    return None


def pointwise_weight(node: fx.Node) -> int:
    """FLOP-equivalents per element of an elementwise op (``ops.POINTWISE_FLOP_WEIGHTS``, measured), reading the
    arguments where the op's price depends on them (``ops.POINTWISE_WEIGHT_RULES``)."""
    pkt = packet(node)
    rule = POINTWISE_WEIGHT_RULES.get(pkt)
    weight = rule(node) if rule is not None else None
    return weight if weight is not None else POINTWISE_FLOP_WEIGHTS.get(pkt, 1)


def _kernel_flops(node: fx.Node, pkt, name: str, out) -> int:
    """A matmul, convolution or attention node's FLOPs, by formula (see ``count_flops``)."""
    formula = FLOP_FORMULAS.get(pkt)
    if formula is not None:
        return formula(node, hinted_shape)
    formula = flop_counter.flop_registry.get(pkt)
    if formula is not None:
        args = _as_meta(tuple(node.args))
        kwargs = {k: _as_meta(v) for k, v in node.kwargs.items()}
        return int(formula(*args, **kwargs, out_val=_as_meta(out)))
    log.debug("no FLOP formula for %s; estimating from output size", name)
    return 2 * hinted_numel(out) * 64


def count_flops(node: fx.Node, cls: OpClass) -> int:
    """Exact for matmul/convolution/attention (FlopCounterMode's own formulas, which it shares with us), plus ours
    where it has none (``ops.FLOP_FORMULAS``: CPU SDPA, grouped_mm); per-element estimates for everything else."""
    out = node.meta.get("val")
    pkt = packet(node)
    name = qualified_name(node)
    if cls in (OpClass.MATMUL, OpClass.CONVOLUTION, OpClass.ATTENTION):
        key = _formula_key(pkt, node)
        if key is not None and key in _FORMULA_FLOPS:
            return _FORMULA_FLOPS[key]
        flops = _kernel_flops(node, pkt, name, out)
        if key is not None:
            if len(_FORMULA_FLOPS) >= FORMULA_CACHE_SIZE:
                _FORMULA_FLOPS.clear()
            _FORMULA_FLOPS[key] = flops
        return flops
    if cls is OpClass.POINTWISE:
        return pointwise_weight(node) * hinted_numel(out)
    if cls in (OpClass.REDUCTION, OpClass.NORM):
        first = _first_tensor_input(node)
        n = hinted_numel(first) if first is not None else hinted_numel(out)
        return (5 if cls is OpClass.NORM else 1) * n
    if cls in (OpClass.GATHER, OpClass.GENERIC, OpClass.RANDOM):
        return hinted_numel(out)
    return 0


# --- the pass ----------------------------------------------------------------------------------------------------

NO_KERNEL = frozenset({OpClass.VIEW, OpClass.GETITEM, OpClass.SYMBOLIC, OpClass.PLACEHOLDER, OpClass.OUTPUT})


def save_traffic_bytes(node: fx.Node, root: fx.Node, root_cls: OpClass, storage: int, nbytes: int) -> int:
    """Bytes moved to keep ``node`` for backward.  Saving reads the value back in backward; if its producer is
    fusible, forward must also write it out."""
    if root.op == "placeholder" and root is not node:
        # A view of a graph input costs no storage, but Inductor may hand it to backward as a copy (channels-last under
        # layout optimisation: GroupNorm's weight views, docs/DESIGN.md §7), while the input itself is free to save and
        # the view free to recompute: price the copy's traffic so that the cut saves the input.
        return nbytes
    return storage * (2 if root_cls in FUSIBLE else 1)


def node_nbytes(node: fx.Node) -> int:
    """``value_nbytes`` of ``node``'s value."""
    return value_nbytes(node.meta.get("val"))


def compute_node_cost(node: fx.Node, profile: DeviceProfile, facts: GraphFacts | None = None) -> NodeCost:
    """``node``'s cost; ``facts``: its graph's ``GraphFacts`` (op classes, inputs, alias roots, bytes), or None for
    a node read by itself."""
    if facts is None:
        cls, inputs, root, nbytes_of = op_class(node), node.all_input_nodes, alias_root(node), node_nbytes
    else:
        cls, inputs, root = facts.op_class[node], facts.inputs_of[node], facts.alias_root[node]
        nbytes_of = facts.nbytes.__getitem__
    val = node.meta.get("val")
    nbytes = nbytes_of(node)
    dtype = _tensor_dtype(val)
    if cls is OpClass.OPAQUE:
        log.debug(
            "no cost model for %s (%s): priced by its bytes and never recomputed", node.name, qualified_name(node)
        )
    if cls in NO_KERNEL:
        flops, moved, est = 0, 0, 0.0
    else:
        flops = count_flops(node, cls)
        if packet(node) in PARTIAL_READ_OPS and inputs:
            # reads as many source bytes as it writes, plus the indices (not the whole source tensor)
            moved = 2 * nbytes + sum(nbytes_of(a) for a in inputs[1:])
        else:
            moved = nbytes + sum(nbytes_of(a) for a in inputs)
        if cls in COMPUTE_BOUND:  # priced by shape at the device's achieved rate (gemm_rates.py)
            shape = gemm_shape(node) if profile.gemm is not None else None
            est = profile.kernel_seconds(flops, moved, dtype, shape, cls is OpClass.ATTENTION)
        else:
            est = profile.seconds(flops, moved, dtype)
    recompute = flops / profile.peak_flops(dtype) if cls in FUSIBLE else est
    root_cls = op_class(root) if facts is None else facts.op_class[root]
    if root.op == "placeholder":
        storage = 0  # graph inputs (parameters, buffers, user inputs) stay alive anyway
    elif isinstance(root.meta.get("val"), (tuple, list)):
        storage = 0  # a tuple is never saved itself; its items are
    else:
        storage = nbytes_of(root)
    traffic = save_traffic_bytes(node, root, root_cls, storage, nbytes)
    return NodeCost(
        op_class=cls,
        nbytes=nbytes,
        storage_nbytes=storage,
        alias_root=root.name,
        flops=flops,
        bytes_moved=moved,
        est_seconds=est,
        recompute_seconds=recompute,
        save_traffic_bytes=traffic,
        dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
    )


def annotate_costs(
    graph: fx.Graph,
    profile: DeviceProfile,
    nodes: Iterable[fx.Node] | None = None,
    facts: GraphFacts | None = None,
) -> dict[fx.Node, NodeCost]:
    """Attach a NodeCost to ``nodes`` of ``graph`` (all of them by default; ``node.meta[COST_KEY]``) and return
    them.  A node left out gets its cost when ``node_cost`` first asks for it.  ``facts``: the graph's
    ``GraphFacts`` (``roles.facts``); without them each node is read by itself."""
    start = time.perf_counter()
    nodes = list(graph.nodes if nodes is None else nodes)
    costs: dict[fx.Node, NodeCost] = {}
    for node in nodes:
        cost = compute_node_cost(node, profile, facts)
        node.meta[COST_KEY] = cost
        costs[node] = cost
    log.debug("annotate_costs: %d nodes, %.4fs", len(nodes), time.perf_counter() - start)
    return costs
