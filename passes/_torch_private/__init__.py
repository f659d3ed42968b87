"""Every private PyTorch API fxremat touches, in one place, behind one version check.

These helpers are what PyTorch's own partitioner uses to turn a chosen saved set into forward and backward graphs
that meet AOTAutograd's contract (output order, SymInts last, RNG threading).  ``split.py`` and ``cse.py`` reproduce
their result faster for ordinary graphs (tested node for node against them) and hand the rest (subgraphs, opaque
objects, ...) to them; the rules those two modules read (placeholder roles, symbol bindings, purity, mutation
regions, output descriptors) come from here too.  They are private and move between releases:
``check_torch_version()`` gates them, and ``tests/passes/test_options_and_private.py`` checks every name in ``__all__``
so that a torch upgrade fails loudly in CI rather than in a user's training run.
"""

from __future__ import annotations

import copy

import torch

# --- imports of private helpers (fail here, not deep inside a compile) ----------------------------------------
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch import config as functorch_config  # noqa: E402
from torch._functorch._aot_autograd.descriptors import (  # noqa: E402
    SavedForBackwardsAOTOutput,
    SavedForBackwardsNoVcCheckAOTOutput,
)
from torch._functorch._aot_autograd.utils import (  # noqa: E402
    _is_bwd_seed_offset,
    _is_fwd_seed_offset,
    _is_primal,
    _is_tangent,
)
from torch._functorch.compile_utils import fx_graph_cse, get_aten_target, raise_getitems, rand_ops  # noqa: E402
from torch._functorch.partitioners import (  # noqa: E402
    _extract_fwd_bwd_modules,
    _extract_fwd_bwd_outputs,
    _must_be_in_backward,
    _must_be_in_forward,
    default_partition,
    force_save_bw_mutation_src,
    force_save_collectives,
    force_save_effectful_ops,
    min_cut_rematerialization_partition,
    reordering_to_mimic_autograd_engine,
    thread_graphsafe_rng_from_hops,
)
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files  # noqa: E402
from torch._inductor.decomposition import select_decomp_table  # noqa: E402
from torch._inductor.lowering import needs_realized_inputs as _needs_realized_inputs  # noqa: E402
from torch._inductor.utils import fresh_cache as _fresh_cache  # noqa: E402
from torch._library.fake_class_registry import FakeScriptObject  # noqa: E402
from torch.fx._lazy_graph_module import _LazyGraphModule, _make_graph_module  # noqa: E402
from torch.fx.experimental._backward_state import BackwardState  # noqa: E402
from torch.fx.experimental.proxy_tensor import is_sym_node  # noqa: E402
from torch.fx.experimental.symbolic_shapes import (  # noqa: E402
    find_symbol_binding_fx_nodes,
    free_symbols,
    free_unbacked_symbols,
    is_symbol_binding_fx_node,
)
from torch.utils.checkpoint import CheckpointPolicy  # noqa: E402

from ..graph.checkpoint_tags import save_checkpoint_boundaries  # noqa: E402  (public API only: outside this module)
from .versions import (  # noqa: E402  (re-exported: the passes read them as tp.NAME)
    BACKWARD_OPS_MARKED,
    BMM_OUTER_PRODUCT_IS_POINTWISE,
    EMBEDDING_GRAD_SCATTER,
    GPU_DOT_BMM_IS_REDUCTION,
    MEMORY_BUDGET_ANNOTATION_KEY,
    OPAQUE_NODES_AND_OUTPUT_TRACES,
    SCHEDULER_DROPS_MUTATION_RENAMES,
    SUPPORTED_TORCH,
    TORCH,
    torch_version_tuple,
    unsupported_torch_reason,
)

if OPAQUE_NODES_AND_OUTPUT_TRACES:
    from torch.fx.experimental.symbolic_shapes import optimization_hint as _no_guard_hint
else:
    from torch.fx.experimental.symbolic_shapes import size_hint as _no_guard_hint

# fmt: off
__all__ = [
    "realizes_inputs",
    "CheckpointPolicy", "CustomPartitionerFn", "RANDOM_OP_PACKETS", "SUPPORTED_TORCH",
    "activation_quantization_enabled", "after_inductor_joint_passes", "aot_autograd", "aot_autograd_as_inductor",
    "aten_target", "inductor_decompositions",
    "copy_graph_module", "copy_node", "cse_enabled", "dce_impure_random", "default_partition",
    "extract_fwd_bwd_outputs", "extract_fwd_bwd_outputs_and_descs", "find_symbol_bindings", "fresh_inductor_cache",
    "functorch_knob", "inductor_layout_switches_at_default", "LAYOUT_SWITCHES", "inductor_config_patched",
    "inductor_reorders_for_peak_memory", "inductor_estimate_counts_outputs", "inner_compile_with_layout",
    "functorch_knob_default", "fx_graph_cse", "get_hash_for_files", "has_free_unbacked_symbols",
    "inductor_layout_optimisation", "inductor_config_value", "MKLDNN_ENABLED_BY_DEFAULT", "mkldnn_enabled",
    "mkldnn_enabled_as",
    "default_buffer_reuse", "inductor_default", "fxremat_buffer_reuse", "inductor_buffer_reuse",
    "inductor_bounds_reuse_by_allocated_buffers", "stock_buffer_reuse", "mark_inputs_never_freed",
    "ALLOCATED", "ESTIMATED",
    "is_backward_state", "is_bwd_seed_offset",
    "is_fwd_seed_offset", "is_mutation_op", "is_primal", "is_script_object", "is_sym_node", "is_tangent",
    "lazy_graph_module", "lazy_graph_modules", "make_graph_module", "mark_must_save", "memory_budget_annotation",
    "MEMORY_BUDGET_ANNOTATION_KEY",
    "must_be_in_backward", "must_be_in_forward", "mutated_inputs", "prepare_joint_graph", "region_memory_budget",
    "TORCH", "OPAQUE_NODES_AND_OUTPUT_TRACES", "GPU_DOT_BMM_IS_REDUCTION", "EMBEDDING_GRAD_SCATTER",
    "BMM_OUTER_PRODUCT_IS_POINTWISE", "BACKWARD_OPS_MARKED", "SCHEDULER_DROPS_MUTATION_RENAMES",
    "pytorch_dead_code_and_cse", "pytorch_default_partition", "saved_output_descs", "size_hint",
    "split_with_saved_values", "storage_identity", "symbol_bound_by", "torch_version_tuple",
    "unsupported_torch_reason", "value_free_symbols", "wait_tensor_target",
]
# fmt: on


# Size used for an unbacked (data-dependent) SymInt that has no hint: the same order as PyTorch's partitioner.
UNBACKED_SIZE_FALLBACK = 4096


def size_hint(value) -> int:
    """A concrete int for a size that may be a SymInt, read through the shape environment's hint so that no
    guard is installed (comparing SymInts would specialise the graph and recompile)."""
    if isinstance(value, torch.SymInt):
        return int(_no_guard_hint(value, fallback=UNBACKED_SIZE_FALLBACK))
    return int(value)


def storage_identity(tensor: torch.Tensor) -> int:
    """An int naming the tensor's storage: what ``StorageWeakRef`` (PyTorch's CSE) compares, its StorageImpl's
    address, without taking and dropping a weak reference per tensor.  Meaningful while the tensor lives (every
    graph keeps its values in ``meta``)."""
    return tensor.untyped_storage()._cdata


# PyTorch's placement predicates read a node's ``partitioner_tag`` and its target's schema only: their answers,
# memoised per (tag, target), cost a dict lookup (classify and the split ask ~15k times at 48 blocks).
_PLACEMENT: dict = {}
_PLACEMENT_CACHE_SIZE = 4096


def _placement(node: torch.fx.Node) -> tuple[bool, bool]:
    """(must be in forward, must be in backward)."""
    try:
        key = (node.meta.get("partitioner_tag"), node.target)
        hit = _PLACEMENT.get(key)
    except TypeError:  # an unhashable target or tag: ask PyTorch every time
        return bool(_must_be_in_forward(node)), bool(_must_be_in_backward(node))
    if hit is None:
        if len(_PLACEMENT) >= _PLACEMENT_CACHE_SIZE:
            _PLACEMENT.clear()
        hit = _PLACEMENT[key] = (bool(_must_be_in_forward(node)), bool(_must_be_in_backward(node)))
    return hit


def must_be_in_backward(node: torch.fx.Node) -> bool:
    return _placement(node)[1]


def must_be_in_forward(node: torch.fx.Node) -> bool:
    return _placement(node)[0]


def extract_fwd_bwd_outputs(joint: torch.fx.GraphModule, num_fwd_outputs: int):
    """(forward outputs, backward outputs) of the joint graph, as nodes (None for a missing gradient)."""
    fwd_outputs, bwd_outputs, _, _ = _extract_fwd_bwd_outputs(joint, num_fwd_outputs=num_fwd_outputs)
    return list(fwd_outputs), list(bwd_outputs)


def extract_fwd_bwd_outputs_and_descs(joint: torch.fx.GraphModule, num_fwd_outputs: int):
    """(forward outputs, backward outputs, forward output descriptors, backward output descriptors)."""
    fwd, bwd, fwd_descs, bwd_descs = _extract_fwd_bwd_outputs(joint, num_fwd_outputs=num_fwd_outputs)
    return list(fwd), list(bwd), list(fwd_descs), list(bwd_descs)


# --- what the fast split (split.py) and the one-pass CSE (cse.py) need to match PyTorch's contract ---------------
# AOTAutograd's placeholder roles (by name), exactly as its partitioners read them.
is_primal = _is_primal
is_tangent = _is_tangent
is_fwd_seed_offset = _is_fwd_seed_offset
is_bwd_seed_offset = _is_bwd_seed_offset
find_symbol_bindings = find_symbol_binding_fx_nodes
symbol_bound_by = is_symbol_binding_fx_node
value_free_symbols = free_symbols
has_free_unbacked_symbols = free_unbacked_symbols
RANDOM_OP_PACKETS = frozenset(rand_ops)
aten_target = get_aten_target


def saved_output_descs(num_saved_values: int, no_vc_check_start: int, num_saved_symbols: int) -> list:
    """The descriptors PyTorch's extraction gives the saved outputs of forward (after the real outputs)."""
    return [
        SavedForBackwardsNoVcCheckAOTOutput(i)
        if no_vc_check_start <= i < num_saved_values
        else SavedForBackwardsAOTOutput(i)
        for i in range(num_saved_values + num_saved_symbols)
    ]


def make_graph_module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule as PyTorch's partitioner makes one: lazy (no code generated until used) inside Inductor's
    compile, which turns lazy graph modules on; an ordinary one elsewhere."""
    return _make_graph_module(root, graph)


_map_arg = torch._C._fx_map_arg  # ``fx.map_arg`` without its callable check: the C walk itself


def copy_node(graph: torch.fx.Graph, node: torch.fx.Node, lookup, name: str | None = None) -> torch.fx.Node:
    """``graph.node_copy(node, lookup)``, for graphs we build ourselves (split.py, cse.py): the same node (op,
    target, args and kwargs mapped by ``lookup``, name, type, a shallow copy of ``meta``) inserted the same way,
    without ``create_node``'s scan of the arguments for raw SymInts.  That scan walks every argument through
    pytree, half the cost of a copy (48 blocks: 12k copies per partition), and on a copy it can only repeat the
    warning the original node already gave.  A graph owned by a module goes through ``node_copy`` (its create-node
    hooks).  ``name``: another name to start from than the node's."""
    if graph.owning_module is not None and name is None:
        return graph.node_copy(node, lookup)
    args = _map_arg(node.args, lookup) if node.args else ()
    kwargs = _map_arg(node.kwargs, lookup) if node.kwargs else torch.fx.immutable_collections.immutable_dict()
    namespace = graph._graph_namespace
    name = namespace.create_name(name or node.name, None)
    new = torch.fx.Node(graph, name, node.op, node.target, args, kwargs, node.type)
    namespace.associate_name_with_obj(name, new)
    graph._insert(new)
    graph._find_nodes_lookup_table.insert(new)
    graph._len += 1
    # Node.__setattr__ would take the node out of the find_nodes table and back in for every attribute
    object.__setattr__(new, "meta", copy.copy(node.meta))
    return new


def detached_copy(graph: torch.fx.Graph, node: torch.fx.Node, lookup, name: str) -> torch.fx.Node:
    """A copy of ``node`` as ``copy_node`` makes it (arguments mapped by ``lookup``, a shallow copy of ``meta``),
    named ``name``, owned by ``graph`` but never inserted in it, and not among its inputs' users: a stand-in the
    simulator reads in a graph that is never built (``simulator/segment_view.py``), which leaves the graph its
    arguments belong to (the joint graph) as it was."""
    args = _map_arg(node.args, lookup) if node.args else ()
    kwargs = _map_arg(node.kwargs, lookup) if node.kwargs else torch.fx.immutable_collections.immutable_dict()
    new = torch.fx.Node(graph, name, node.op, node.target, args, kwargs, node.type)
    for read in new.all_input_nodes:
        read.users.pop(new, None)
    object.__setattr__(new, "meta", copy.copy(node.meta))
    return new


def lazy_graph_modules():
    """The context Inductor's ``compile_fx`` partitions in: GraphModules made through ``make_graph_module`` (ours and
    PyTorch's) generate their Python code only when first used (benchmarks time both settings)."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(True)


def lazy_graph_module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated only if someone reads or calls it (the prepared joint graph:
    our passes read its nodes, never its code)."""
    return _LazyGraphModule(root, graph)


def dce_impure_random() -> bool:
    """Whether ``Graph.eliminate_dead_code`` keeps unused random ops here (its own rule, read the same way)."""
    if torch._guards.TracingContext.try_get():
        return bool(torch._inductor.config.fallback_random)
    return True


def is_mutation_op(node: torch.fx.Node) -> bool:
    """Inductor's rule for where a mutation region starts (what PyTorch's CSE keys merges on)."""
    from torch._inductor.pattern_matcher import is_mutation_op as inductor_is_mutation_op

    return bool(inductor_is_mutation_op(node))


def is_backward_state(node: torch.fx.Node) -> bool:
    return node.op == "placeholder" and isinstance(node.meta.get("val"), BackwardState)


def is_script_object(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (torch.ScriptObject, FakeScriptObject))


def activation_quantization_enabled() -> bool:
    """PyTorch's extraction quantizes saved activations when this Inductor pass is configured."""

    return inductor_config.post_grad_fusion_options.get("activation_quantization_aten_pass", None) is not None


def wait_tensor_target():
    """``_c10d_functional.wait_tensor`` (None without distributed): PyTorch's extraction drops a saved value
    whose only backward readers are dead waits."""
    if not torch.distributed.is_available():
        return None
    return torch.ops._c10d_functional.wait_tensor.default


def mutated_inputs(nodes, fwd_descs) -> set[torch.fx.Node]:
    """Graph inputs that forward mutates in place, of a joint graph's ``nodes`` whose forward outputs have the
    descriptors ``fwd_descs`` (``extract_fwd_bwd_outputs_and_descs``): destinations of in-graph ``copy_`` epilogues
    (Inductor keeps input mutations in the graph), and inputs whose new value forward returns for the runtime to
    apply (AOTAutograd's ``InputMutationAOTOutput`` descriptors, when mutations are not kept in the graph)."""
    from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput

    placeholders = [n for n in nodes if n.op == "placeholder"]
    mutated = set()
    for node in nodes:
        target = node.target
        if (
            isinstance(target, torch._ops.OpOverload)
            and target._schema.is_mutable
            and node.args
            and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].op == "placeholder"
        ):
            mutated.add(node.args[0])
    wanted = {d.mutated_input for d in fwd_descs if isinstance(d, InputMutationAOTOutput)}
    if wanted:
        mutated.update(p for p in placeholders if p.meta.get("desc") in wanted)
    return mutated


def cse_enabled() -> bool:
    return bool(functorch_config.cse)


def pytorch_dead_code_and_cse(joint: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """PyTorch's partitioner's first steps, in place: dead code out, then CSE (setting the graph recompiles)."""
    joint.graph.eliminate_dead_code()
    if functorch_config.cse:
        joint.graph = fx_graph_cse(joint.graph)
    else:
        joint.recompile()
    return joint


def mark_must_save(joint: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Checkpoint-tag clean-up and MUST_SAVE marks on collectives, effectful ops and sources of backward mutations
    (never recomputing those is a safety rule), as PyTorch's partitioner does before it decides anything."""
    save_checkpoint_boundaries(joint)
    if not functorch_config.unsafe_allow_optimization_of_collectives:
        force_save_collectives(joint)
    force_save_effectful_ops(joint)
    force_save_bw_mutation_src(joint)
    return joint


def prepare_joint_graph(joint: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The clean-up PyTorch's min-cut partitioner does before it decides anything, with PyTorch's own passes and
    in place, so that both partitioners see the same graph: dead code out, CSE, checkpoint-tag clean-up, and
    MUST_SAVE marks (``mark_must_save``).  ``fxremat_passes.graph.cse.prepare_joint_graph`` gives the same graph
    faster, without copying a joint graph that dead code elimination and CSE leave as it is."""
    return mark_must_save(pytorch_dead_code_and_cse(joint))


def split_with_saved_values(
    joint: torch.fx.GraphModule,
    saved_values: list[torch.fx.Node],
    saved_sym_nodes: list[torch.fx.Node],
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Forward graph returning ``saved_values`` (and SymInts last), backward graph computing everything else it
    needs from them: PyTorch's own extraction, so the AOTAutograd contract holds by construction."""
    from torch.utils._ordered_set import OrderedSet

    opaque = {"saved_opaque_nodes": []} if OPAQUE_NODES_AND_OUTPUT_TRACES else {}
    fw, bw = _extract_fwd_bwd_modules(
        joint,
        saved_values,
        saved_sym_nodes=saved_sym_nodes,
        **opaque,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=OrderedSet(static_lifetime_input_nodes),
    )
    bw = reordering_to_mimic_autograd_engine(bw)
    fw = raise_getitems(fw)
    bw = raise_getitems(bw)
    fw = thread_graphsafe_rng_from_hops(fw, is_backward=False)
    bw = thread_graphsafe_rng_from_hops(bw, is_backward=True)
    return fw, bw


def pytorch_default_partition(
    joint: torch.fx.GraphModule,
    joint_inputs,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: list[int] | None,
    activation_memory_budget: float = 1.0,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """PyTorch's ``min_cut_rematerialization_partition`` with its own defaults, whatever the user set globally
    (an ``activation_memory_budget`` a user set for PyTorch must not leak into our baseline or fallback); a budget
    only when asked for explicitly (the report's comparison points)."""
    with functorch_config.patch(activation_memory_budget=activation_memory_budget):
        return min_cut_rematerialization_partition(
            joint,
            joint_inputs,
            compiler="inductor",
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices,
        )


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A structural copy that shares node metadata objects (FakeTensors are not deep-copied)."""
    import warnings

    with warnings.catch_warnings():
        # deepcopy of the graph's pytree codegen trips a FutureWarning about LeafSpec inside torch itself
        warnings.simplefilter("ignore", FutureWarning)
        return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def aot_autograd_as_inductor(partition_fn, compiler):
    """A Dynamo backend that runs AOTAutograd the way Inductor's ``compile_fx`` does (Inductor's decompositions,
    input mutations kept in the graph) but hands forward and backward to ``compiler`` instead of generating code:
    the partitioner sees the joint graphs Inductor would give it, in seconds.  Without Inductor's decompositions
    the graphs differ (other saved bytes); without kept mutations AOTAutograd copies a BatchNorm's running stats
    back after the forward, and a plan that re-reads them in backward trips autograd's version check."""
    return aot_autograd(
        fw_compiler=compiler,
        bw_compiler=compiler,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
        keep_inference_input_mutations=True,
    )


def inductor_decompositions() -> dict:
    """The decompositions Inductor's ``compile_fx`` traces with (for tools that trace as Inductor would)."""
    return select_decomp_table()


def after_inductor_joint_passes(partitioner: CustomPartitionerFn):
    """A ``partition_fn`` that runs Inductor's joint-graph passes before ``partitioner``, as Inductor's compile does
    (without them some joint graphs differ: plans, peaks, the backward's reorders): Inductor's own ``partition_fn``
    with ``partitioner`` as its ``custom_partitioner_fn``, which torch 2.11 to 2.14 honour alike (2.13's
    ``partitioner_fn_override`` argument is not in 2.11)."""
    import torch._inductor.compile_fx as compile_fx

    def partition_fn(gm, joint_inputs, **kwargs):
        with inductor_config.patch(custom_partitioner_fn=partitioner):
            return compile_fx.partition_fn(gm, joint_inputs, **kwargs)

    return partition_fn


def realizes_inputs(node: torch.fx.Node) -> bool:
    """Whether Inductor realizes the inputs of ``node``'s op when they have several users: the ops of
    ``torch._inductor.lowering.needs_realized_inputs`` (matmuls, convolutions, fallbacks), which
    ``GraphLowering.run_node`` (torch/_inductor/graph.py) asks to ``realize_hint`` such an input."""
    return node.target in _needs_realized_inputs


def fresh_inductor_cache():
    """A context with an empty Inductor cache, on disk (a temporary ``TORCHINDUCTOR_CACHE_DIR``) and in memory:
    ``torch._inductor.utils.fresh_cache``.  The demo times each compile in one."""
    return _fresh_cache()


# Inductor's buffer reuse in fxremat's compiles (bounded by the bytes really allocated)
from .buffer_reuse import (  # noqa: E402
    ALLOCATED,
    ESTIMATED,
    default_buffer_reuse,
    fxremat_buffer_reuse,
    inductor_bounds_reuse_by_allocated_buffers,
    inductor_buffer_reuse,
    mark_inputs_never_freed,
    stock_buffer_reuse,
)

# PyTorch's memory knobs and region annotations, as fxremat reads them (fxremat/knobs.py)
from .knobs import (  # noqa: E402
    LAYOUT_SWITCHES,
    MKLDNN_ENABLED_BY_DEFAULT,
    functorch_knob,
    functorch_knob_default,
    inductor_config_patched,
    inductor_config_value,
    inductor_default,
    inductor_estimate_counts_outputs,
    inductor_layout_optimisation,
    inductor_layout_switches_at_default,
    inductor_reorders_for_peak_memory,
    inner_compile_with_layout,
    memory_budget_annotation,
    mkldnn_enabled,
    mkldnn_enabled_as,
    region_memory_budget,
)

# Inductor's scheduler, patched for fxremat's compiles alone (each hook gated by its caller's ``applies``)
