"""The one op table: every FX node gets an ``OpClass``, from ``torch.Tag`` where one exists and from a few named
sets where it does not.  Every op set and single op that another module matches lives here (the lowering facts,
the layout pass's convolutions, the split's ``copy_``), and so does every op's FLOP price (``POINTWISE_FLOP_WEIGHTS``
and its argument-dependent cases, ``FLOP_FORMULAS``), which ``costs.py`` only applies: nobody else names an op."""

from __future__ import annotations

import enum
import operator

import torch
import torch.fx as fx

from .flop_formulas import grouped_mm_flops, sdpa_backward_flops, sdpa_flops

aten = torch.ops.aten


def _packets(*names: str) -> frozenset:
    """aten op packets by name; names this torch does not have are skipped (tables outlive op renames)."""
    return frozenset(p for p in (getattr(aten, n, None) for n in names) if p is not None)


class OpClass(enum.Enum):
    PLACEHOLDER = "placeholder"
    OUTPUT = "output"
    GETITEM = "getitem"  # picks one item of a multi-output node: free
    SYMBOLIC = "symbolic"  # SymInt arithmetic (operator.*, sym_size): free, never "unknown"
    VIEW = "view"  # aliases its input: no compute, no new storage
    CREATION = "creation"  # full/zeros/ones/arange/empty: writes only
    POINTWISE = "pointwise"  # elementwise; fuses into its consumer
    COPY = "copy"  # layout/dtype copies, cat: memory-bound, fusible
    REDUCTION = "reduction"  # sum/amax/var_mean: reads much, writes little
    NORM = "norm"  # layer/batch/group norm and softmax: a few passes over the input
    MATMUL = "matmul"
    CONVOLUTION = "convolution"
    ATTENTION = "attention"
    GATHER = "gather"  # embedding/index/gather/scatter
    RANDOM = "random"  # draws random numbers: never recomputed
    SEED = "seed"  # generates RNG seeds: never recomputed
    COLLECTIVE = "collective"  # communicates with other ranks: never recomputed
    MUTATION = "mutation"  # writes into an argument: never recomputed
    GENERIC = "generic"  # an aten/prims op outside these tables: priced as memory-bound, recomputable
    OPAQUE = "opaque"  # custom ops, HOPs, anything not aten/prims: treated as expensive and never recomputed


MATMUL_OPS = _packets("mm", "addmm", "bmm", "baddbmm", "matmul", "_int_mm", "_scaled_mm", "_grouped_mm")
CONVOLUTION_OPS = _packets("convolution", "_convolution", "convolution_backward", "cudnn_convolution")
# gemm_rates.gemm_shape: the (a, b) operand positions of the matmuls that multiply an ``m x k`` by a ``k x n``
# (batched where the operands have more dimensions).
GEMM_OPERANDS = {
    packet: operands
    for name, operands in (("mm", (0, 1)), ("addmm", (1, 2)), ("bmm", (0, 1)), ("baddbmm", (1, 2)), ("_int_mm", (0, 1)))
    if (packet := getattr(aten, name, None)) is not None
}
# The scaled-dot-product attention forwards, each with an optional dropout argument (DROPOUT_ARG_OPS).
_SDPA_FORWARD_NAMES = (
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
)
ATTENTION_OPS = _packets(
    *_SDPA_FORWARD_NAMES,
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
)
NORM_OPS = _packets(
    "native_layer_norm",
    "native_group_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "_softmax",
    "_log_softmax",
    "_safe_softmax",
    "native_layer_norm_backward",
    "native_group_norm_backward",
    "native_batch_norm_backward",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "rms_norm",
    "_fused_rms_norm",
)
GATHER_OPS = _packets(
    "embedding",
    "embedding_dense_backward",
    "index",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_put",
    "_unsafe_index",
    "_unsafe_index_put",
    "_unsafe_masked_index_put_accumulate",  # Inductor's decomposition of embedding_dense_backward
    "take_along_dim",
    "select_scatter",
    "slice_scatter",
    "index_add",
)
# Gathers read only the rows they pick from their first argument, not all of it.
PARTIAL_READ_OPS = _packets("embedding", "index", "index_select", "gather", "_unsafe_index", "take_along_dim")
# Ops that return an alias of their first input although their schema does not say so (matmul's decomposition
# reshapes through _unsafe_view): priced as views.
ALIAS_OPS = _packets("_unsafe_view", "alias", "lift_fresh")
CREATION_OPS = _packets(
    "full",
    "zeros",
    "ones",
    "empty",
    "empty_strided",
    "arange",
    "scalar_tensor",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "lift_fresh_copy",
    "iota",
)
COPY_OPS = _packets("_to_copy", "clone", "cat", "constant_pad_nd", "copy", "clamp", "where", "stack")
SEED_OPS = frozenset({"prims.inductor_seeds"})
# Inductor's own random draw (its decomposition of dropout and rand*): a pointwise op, registered only once
# torch._inductor is imported, so matched by name.
INDUCTOR_RANDOM = "prims.inductor_random"
# Ops whose "random" tag comes only from an optional dropout argument (SDPA's op is tagged random although it
# draws nothing without a dropout probability).
DROPOUT_ARG_OPS = _packets(*_SDPA_FORWARD_NAMES)
# CUDA attention backward kernels tagged nondeterministic_seeded: they are given the forward's philox seed and offset
# and replay its dropout mask, so they are deterministic attention (the test on meta tensors found them counted as
# random ops at one FLOP per element).
SEEDED_ATTENTION_BACKWARD = _packets(
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward"
)
# What one elementwise op costs per element, in add/mul equivalents: the FLOP term of the roofline (a recomputed
# erf/tanh/exp chain is compute bound inside its fused kernel, so this is its price).  The values come from
# benchmarks/investigations/pointwise_eager.py: ATen's vectorised kernel of the op (the same at::vec/SLEEF code
# Inductor's CPU kernels call) beyond a memory-bound mul/add over the same bytes, over the price of one add inside a
# fused Inductor kernel (benchmarks/investigations/pointwise_weights.py), rounded.  Fused chains measured by the
# latter cost more, so these are lower bounds (docs/DESIGN.md §13).  Fixed constants: the same graph gives the same
# cut on any machine.
# Ops not listed cost 1 (add, mul, sub, neg, relu, where, tanh_backward and sigmoid_backward, which are a few muls); a
# division by a Python scalar costs 1 (Inductor multiplies by the reciprocal) and ``pow`` with an integer exponent
# is ``POW_INT_WEIGHT`` (Inductor expands it into multiplications): ``POINTWISE_WEIGHT_RULES`` read the arguments.
POINTWISE_FLOP_WEIGHTS = {
    packet: weight
    for name, weight in (
        ("tanh", 38),
        ("sigmoid", 2),
        ("erf", 17),
        ("erfinv", 17),  # not measured: priced as erf
        ("exp", 9),
        ("exp2", 9),  # not measured: priced as exp
        ("expm1", 9),  # not measured: priced as exp
        ("log", 14),
        ("log2", 14),  # not measured: priced as log
        ("log1p", 14),  # not measured: priced as log
        ("sqrt", 2),
        ("rsqrt", 1),
        ("reciprocal", 1),
        ("div", 1),
        ("pow", 29),
        ("sin", 16),
        ("cos", 17),
        ("gelu", 4),  # the erf form; approximate="tanh" is priced by costs.pointwise_weight
        ("gelu_backward", 13),
        ("silu", 3),
        ("silu_backward", 4),
        ("softplus", 23),  # not measured: exp + log1p
        ("mish", 61),  # not measured: softplus + tanh
        ("elu", 9),  # not measured: an exp
    )
    if (packet := getattr(aten, name, None)) is not None
}
GELU_TANH_WEIGHT = 20
POW_INT_WEIGHT = 2


def _div_weight(node: fx.Node) -> int | None:
    # by a Python scalar: Inductor multiplies by its reciprocal
    return 1 if len(node.args) > 1 and not isinstance(node.args[1], fx.Node) else None


def _pow_weight(node: fx.Node) -> int | None:
    exponent = node.args[1] if len(node.args) > 1 else None
    if isinstance(exponent, int) or (isinstance(exponent, float) and exponent.is_integer()):
        return POW_INT_WEIGHT  # Inductor expands an integer power into multiplications
    return None


def _gelu_weight(node: fx.Node) -> int | None:
    return GELU_TANH_WEIGHT if get_arg(node, "approximate", "none") == "tanh" else None


# The weights that depend on an op's arguments, by packet: each returns the weight, or None where the op's entry in
# POINTWISE_FLOP_WEIGHTS (or 1) holds; costs.pointwise_weight asks here first.
POINTWISE_WEIGHT_RULES = {
    aten.div: _div_weight,
    aten.pow: _pow_weight,
    aten.gelu: _gelu_weight,
    aten.gelu_backward: _gelu_weight,
}


def _sdpa_flops(node: fx.Node, shape) -> int:
    q, k, v = node.args[:3]
    return sdpa_flops(shape(q), shape(k), shape(v))


def _sdpa_backward_flops(node: fx.Node, shape) -> int:
    _grad_out, q, k, v = node.args[:4]
    return sdpa_backward_flops(shape(q), shape(k), shape(v))


def _grouped_mm_flops(node: fx.Node, shape) -> int:
    a, b = node.args[:2]
    return grouped_mm_flops(shape(a), shape(b), shape(node))


# FLOP formulas of the matmul, convolution and attention ops that FlopCounterMode does not count (the CPU SDPA
# kernels, grouped_mm) or counts differently across releases (the GPU SDPA kernels under grouped-query attention), by
# packet: ``formula(node, shape)``, where ``shape`` gives a node's shape in plain ints
# (costs.hinted_shape).  costs._kernel_flops asks here first, then FlopCounterMode's registry; an op in neither is
# estimated from its output size.
FLOP_FORMULAS = {
    packet: formula
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa_flops),
        ("_scaled_dot_product_attention_math", _sdpa_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward_flops),
        ("_scaled_dot_product_efficient_attention", _sdpa_flops),
        ("_scaled_dot_product_flash_attention", _sdpa_flops),
        ("_scaled_dot_product_cudnn_attention", _sdpa_flops),
        ("_scaled_dot_product_efficient_attention_backward", _sdpa_backward_flops),
        ("_scaled_dot_product_flash_attention_backward", _sdpa_backward_flops),
        ("_scaled_dot_product_cudnn_attention_backward", _sdpa_backward_flops),
        ("_grouped_mm", _grouped_mm_flops),
    )
    if (packet := getattr(aten, name, None)) is not None
}
SYMBOLIC_TARGETS = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.neg,
        operator.pow,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        torch.sym_float,
        torch.sym_int,
        torch.sym_sqrt,
    }
)


# Op families recognised by packet, checked in this order after the tag-based classes (random, mutation, view).
_PACKET_CLASSES = (
    (MATMUL_OPS, OpClass.MATMUL),
    (CONVOLUTION_OPS, OpClass.CONVOLUTION),
    (ATTENTION_OPS, OpClass.ATTENTION),
    (NORM_OPS, OpClass.NORM),
    (GATHER_OPS, OpClass.GATHER),
    (CREATION_OPS, OpClass.CREATION),
)


def packet(node: fx.Node):
    """The OpOverloadPacket of an aten/prims call, or None."""
    target = node.target
    return getattr(target, "overloadpacket", None)


def overload_named(name: str):
    """The op overload ``name`` names (``"aten.mm.default"``): how a recorded graph's targets are read back."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def qualified_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return getattr(target, "__name__", str(target))


def get_arg(node: fx.Node, name: str, default=None):
    """The value of a named schema argument, positional or keyword."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return default
    for index, argument in enumerate(schema.arguments):
        if argument.name == name:
            if index < len(node.args) and not argument.kwarg_only:
                return node.args[index]
            return default
    return default


def has_tag(node: fx.Node, tag: torch.Tag) -> bool:
    return tag in getattr(node.target, "tags", ())


def is_collective(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace in ("_c10d_functional", "c10d_functional")


# op_class by call_function target, for the targets whose class depends on nothing else (every pass asks for it,
# thousands of times per graph).
_CLASS_BY_TARGET: dict = {}


def op_class(node: fx.Node) -> OpClass:
    if node.op == "call_function":
        target = node.target
        try:
            cls = _CLASS_BY_TARGET.get(target)
        except TypeError:  # an unhashable target: classify it every time
            return _op_class(node)
        if cls is None:
            cls = _op_class(node)
            # SDPA's class depends on its dropout_p argument
            if getattr(target, "overloadpacket", None) not in DROPOUT_ARG_OPS:
                _CLASS_BY_TARGET[target] = cls
        return cls
    return _op_class(node)


def _op_class(node: fx.Node) -> OpClass:
    if node.op == "placeholder":
        return OpClass.PLACEHOLDER
    if node.op == "output":
        return OpClass.OUTPUT
    if node.op != "call_function":
        return OpClass.OPAQUE
    target = node.target
    if target is operator.getitem:
        return OpClass.GETITEM
    if target in SYMBOLIC_TARGETS or target in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default):
        return OpClass.SYMBOLIC
    if not isinstance(target, torch._ops.OpOverload):
        return OpClass.OPAQUE
    if is_collective(node):
        return OpClass.COLLECTIVE
    if qualified_name(node) in SEED_OPS:
        return OpClass.SEED
    pkt = target.overloadpacket
    if pkt in SEEDED_ATTENTION_BACKWARD:
        return OpClass.ATTENTION
    if has_tag(node, torch.Tag.nondeterministic_seeded):
        if pkt in DROPOUT_ARG_OPS and not get_arg(node, "dropout_p", 0.0):
            return OpClass.ATTENTION
        return OpClass.RANDOM
    if target._schema.is_mutable:
        return OpClass.MUTATION
    if target.is_view or pkt in ALIAS_OPS:
        return OpClass.VIEW
    for packets, cls in _PACKET_CLASSES:
        if pkt in packets:
            return cls
    if has_tag(node, torch.Tag.reduction):
        return OpClass.REDUCTION
    if pkt in COPY_OPS:
        return OpClass.COPY
    if has_tag(node, torch.Tag.pointwise) or qualified_name(node) == INDUCTOR_RANDOM:
        return OpClass.POINTWISE
    if target.namespace in ("aten", "prims"):
        return OpClass.GENERIC
    return OpClass.OPAQUE


# Classes whose recompute we never consider, whatever it would save (safety, not cost), and why: the report's words.
NEVER_RECOMPUTE_REASONS = {
    OpClass.RANDOM: "random op: recomputing would draw new random numbers",
    OpClass.SEED: "RNG seed generation: recomputing would change the random stream",
    OpClass.COLLECTIVE: "collective: ranks could decide differently and hang",
    OpClass.MUTATION: "mutates an argument",
    OpClass.OPAQUE: "opaque op (custom op or higher-order op): cost unknown",
}
NEVER_RECOMPUTE = frozenset(NEVER_RECOMPUTE_REASONS)
# Matmul-class kernels (matmuls, convolutions, attention): compute-bound on a GPU, priced by shape at achieved
# throughput (``gemm_rates.GemmModel``, docs/DESIGN.md §4.2) and never recomputed by the no-budget default plan (§4.5).
COMPUTE_BOUND = frozenset({OpClass.MATMUL, OpClass.CONVOLUTION, OpClass.ATTENTION})
COMPUTE_BOUND_OPS = MATMUL_OPS | CONVOLUTION_OPS | ATTENTION_OPS


def is_compute_bound_name(qualified: str) -> bool:
    """Whether the op named ``qualified`` (as ``qualified_name`` writes it: a report row's ``op``, "aten.addmm") is
    matmul-class (``COMPUTE_BOUND_OPS``)."""
    namespace, _, name = qualified.partition(".")
    return getattr(getattr(torch.ops, namespace, None), name, None) in COMPUTE_BOUND_OPS


# Classes that Inductor fuses into their consumer (so a recompute costs FLOPs, not a round trip to memory).
FUSIBLE = frozenset({OpClass.VIEW, OpClass.POINTWISE, OpClass.COPY, OpClass.CREATION, OpClass.GETITEM})

# --- ops other modules match (by identity: ``node.target is ...`` or a packet ``in`` a set) ----------------------

# lowering.py: gathers Inductor lowers to indexed loads inside the kernel that reads them (so they fuse like
# pointwise ops): the gathers that read only the rows they pick, one set for both facts, so that a new gather is
# priced and lowered alike.
FUSED_LOADS = PARTIAL_READ_OPS
# lowering.py: scatters into a slice Inductor lowers to a pointwise select between the two inputs
# (``lowering.slice_scatter``): RoPE's backward (the gradient of a cat of two halves) fuses into the add that reads it.
POINTWISE_SCATTERS = _packets("slice_scatter", "select_scatter")
# lowering.column_reduction: reductions whose second argument is the list of reduced dimensions.
REDUCTIONS_WITH_DIMS = _packets("sum", "mean", "amax", "amin", "prod", "var", "std", "var_mean")
# lowering.py: ops whose Inductor code calls exp, log, sigmoid or tanh (directly or through their decomposition): a
# value computing one is stored, not recomputed, when several nodes read it on CPU (``_realized_on_reuse``).
HEAVY_OPS = _packets(
    *(
        "exp log log10 log1p log2 sigmoid tanh silu silu_backward gelu_backward softplus softplus_backward mish "
        "mish_backward logit"
    ).split()
)
# lowering.py: single ops its rules name (a CPU ``cat`` is a ConcatKernel, ``add(mm, c)`` an addmm, a ``bmm`` with one
# row or column per batch a reduction).
ADD = aten.add.Tensor
MM = aten.mm.default
BMM = aten.bmm  # the packet: every overload
CAT = aten.cat.default
# layout.py: what Inductor's layout optimisation reads and writes.
CONVOLUTION = aten.convolution.default
CONVOLUTION_BACKWARD = aten.convolution_backward.default
CLONE = aten.clone.default
VIEW = aten.view.default
# layout.py: the ops whose result depends on their first input's strides, not only on its values (Inductor's own
# list of "as_strided ops" in ``GraphLowering.run_node``, less the in-place and resize ones a functional graph has
# not).
STRIDE_SENSITIVE = (aten.as_strided.default, aten.as_strided_scatter.default)
# phase_copies.py: row lookups, where each output element reads one element of the table, found by the index.
ROW_LOOKUPS = frozenset({aten.index.Tensor, aten.gather.default, aten.index_select.default, aten.embedding.default})
# cse.py: never merged (as in PyTorch's ``fx_graph_cse``: its values are undefined, so two are not one).
EMPTY = aten.empty
# split.py: the in-place copy that PyTorch's autograd-order reordering of backward places before the first reader of
# a tangent, where it stands (``reordering_to_mimic_autograd_engine``).
COPY_INTO = aten.copy_.default
# loss_region.py: the loss region (docs/DESIGN.md §14): the projection, the ops between it and the log-softmax that
# change neither the values' order nor their count, the cross-entropy forward and backward, and the backward ops
# between the logits' gradient and the projection's gradients.
PROJECTIONS = (aten.mm.default, aten.addmm.default)
LOGITS_PASSTHROUGH = frozenset(
    {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default, aten.detach.default}
)
DTYPE_CASTS = frozenset({aten._to_copy.default, torch.ops.prims.convert_element_type.default})
LOG_SOFTMAX = aten._log_softmax.default
LOG_SOFTMAX_BACKWARD = aten._log_softmax_backward_data.default
NLL_FORWARD = aten.nll_loss_forward.default
NLL_BACKWARD = aten.nll_loss_backward.default
TRANSPOSES = frozenset({aten.t.default, aten.permute.default, aten.transpose.int})
SUM_DIMS = aten.sum.dim_IntList
# loss_region.py: the same loss after Inductor's decompositions (``torch._decomp``): the log-softmax, the NLL and their
# backward's pointwise ops between the logits' gradient and the cross-entropy's own nodes (docs/DESIGN.md §14).
AMAX, LOG, EXP = aten.amax.default, aten.log.default, aten.exp.default
SUB, MUL, DIV = aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor
GATHER, SQUEEZE_DIM, NEG = aten.gather.default, aten.squeeze.dim, aten.neg.default
WHERE, SUM, NE_SCALAR, UNSQUEEZE = aten.where.self, aten.sum.default, aten.ne.Scalar, aten.unsqueeze.default
# the NLL backward's one-hot, -1 at the target: a scatter, or as Inductor's joint passes rewrite it, a where(eq(iota))
SCATTER_VALUE, FULL, SCALAR_TENSOR = aten.scatter.value, aten.full.default, aten.scalar_tensor.default
EQ, EXPAND, IOTA = aten.eq.Tensor, aten.expand.default, torch.ops.prims.iota.default  # and VIEW, above
DECOMPOSED_LOSS_BACKWARD = frozenset({EXP, MUL, SUB, WHERE, DIV, SUM_DIMS})
# loss_chunks.py: the ops of the chunked loss it writes, all of them ops Inductor lowers after its decompositions
# (docs/DESIGN.md §14), by the name the rewrite calls them.
CHUNK_OPS = {
    **{n: getattr(aten, n).default for n in ("mm", "addmm", "unsqueeze", "gather", "exp", "log", "amax", "permute")},
    **{n: getattr(aten, n).default for n in ("cat", "view", "_unsafe_masked_index_put_accumulate", "index_put")},
    **{name: getattr(aten, name).Tensor for name in ("slice", "mul", "sub", "add", "div", "eq")},
    "ne": aten.ne.Scalar,
    "where": aten.where.self,
    "sum": aten.sum.default,
    "sum_dims": aten.sum.dim_IntList,
    "to": torch.ops.prims.convert_element_type.default,
    "iota": torch.ops.prims.iota.default,
}
