"""What differs between the torch releases fxremat supports (2.11 to 2.14), one test per difference.

Each version key in ``_torch_private`` is checked against the installed torch itself (the signature, attribute or
source line the key stands for), so a key that is wrong for some release fails on that release's CI run.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.fx as fx
from helpers import noop_compiler
from torch._functorch import partitioners
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.ops import OpClass, op_class
from fxremat_passes.simulator import lowering
from fxremat_passes.simulator.backends import backend_rules


def test_version_keys_match_the_installed_torch():
    """2.12 added ``saved_opaque_nodes`` and ``output_stack_traces``; 2.13 ``region_activation_memory_budget``, the
    backward ops' ``autograd_backward`` mark, the GPU dot-shaped bmm lowering and (2.13 only) the C++ fusion step
    that loses mutation renames."""
    from torch._inductor.kernel import bmm

    extraction = inspect.signature(partitioners._extract_fwd_bwd_modules).parameters
    assert ("saved_opaque_nodes" in extraction) == tp.OPAQUE_NODES_AND_OUTPUT_TRACES
    traces = "output_stack_traces" in inspect.getsource(partitioners._extract_graph_with_inputs_outputs)
    assert traces == tp.OPAQUE_NODES_AND_OUTPUT_TRACES
    assert hasattr(torch.autograd.graph, "region_activation_memory_budget") == (tp.TORCH >= (2, 13))
    assert hasattr(bmm, "_BMM_DOT_DECOMPOSE_DTYPES") == tp.GPU_DOT_BMM_IS_REDUCTION
    marks = "autograd_backward" in inspect.getsource(partitioners._extract_fwd_bwd_modules)
    assert marks == tp.BACKWARD_OPS_MARKED
    from torch._inductor.codegen.cpp import CppScheduling  # where 2.13's scheduler loses the renames (DESIGN §7)
    from torch._inductor.scheduler import SchedulerNode

    from fxremat_passes._torch_private import scheduler as hooks

    pytorchs = inspect.getsource(hooks._unfixed_recompute or SchedulerNode.recompute_size_and_body)  # not our wrapper
    drops = hasattr(CppScheduling, "_align_compatible_range_nodes") and "or self.mutation_renames" not in pytorchs
    assert drops == tp.SCHEDULER_DROPS_MUTATION_RENAMES  # 2.14 re-applies the renames itself
    if tp.TORCH >= (2, 13):  # our key and read are PyTorch's own
        import torch.fx.traceback as fx_traceback

        assert fx_traceback.MEMORY_BUDGET_ANNOTATION_KEY == tp.MEMORY_BUDGET_ANNOTATION_KEY
        node = fx.Graph().placeholder("x")
        node.meta["custom"] = {tp.MEMORY_BUDGET_ANNOTATION_KEY: 0.5}
        assert fx_traceback._get_memory_budget_annotation(node) == tp.memory_budget_annotation(node) == 0.5


def test_the_fusion_veto_reads_what_every_supported_inductor_has():
    """``inductor_vetoes_dragging_fusions`` wraps ``InductorChoices.can_fuse(scheduler, node1, node2,
    shared_data_score)`` and reads the scheduler's ``ancestors``, ``min_order``, ``name_to_fused_node``,
    ``dep_size_hint`` and ``score_fusion_memory``; its premise is that a fused node takes its earliest member's
    place (``fuse_nodes_once`` sorts by ``min_order``), dependencies first."""
    from torch._inductor import scheduler
    from torch._inductor.choices import InductorChoices

    from fxremat_passes._torch_private import scheduler as hooks

    can_fuse = hooks._unvetoed_can_fuse or InductorChoices.can_fuse
    assert list(inspect.signature(can_fuse).parameters) == ["scheduler", "node1", "node2", "shared_data_score"]
    assert callable(scheduler.Scheduler.dep_size_hint) and callable(scheduler.Scheduler.score_fusion_memory)
    assert "self.name_to_fused_node" in inspect.getsource(scheduler.Scheduler)
    assert "self.ancestors" in inspect.getsource(scheduler.BaseSchedulerNode)
    assert "key=lambda x: x.min_order" in inspect.getsource(scheduler.Scheduler.fuse_nodes_once)


def test_fxremats_compiles_replace_the_estimate_inductors_wrapper_bounds_buffer_reuse_by():
    """``_torch_private/buffer_reuse.py`` replaces the fields of ``EfficientPeakEstimate`` that
    ``should_reuse_buffer`` reads (``buffer_pool._pool_held`` replays the rule), from the memory timeline Inductor
    builds them from, less the buffers the wrapper never allocates (``removed_buffers``, in-place ``reuses``)."""
    import dataclasses

    import torch._inductor.config as inductor_config
    from torch._inductor import graph, memory
    from torch._inductor.codegen import segmented_tree, wrapper

    from fxremat_passes._torch_private import buffer_reuse

    assert isinstance(inductor_config.allow_buffer_reuse, bool)
    assert "config.allow_buffer_reuse" in inspect.getsource(wrapper.AllocateLine.plan)
    source = inspect.getsource(wrapper.AllocateLine.should_reuse_buffer)
    assert "overall_peak_memory" in source and "peak_between" in source
    stock = inspect.getsource(buffer_reuse._stock_estimate_init or wrapper.EfficientPeakEstimate.__init__)
    for name in ("self.overall_peak_memory", "self.segmented_tree", "SegmentedTree(", "get_freeable_input_buf"):
        assert name in stock, name
    assert "self.segmented_tree.summarize_range" in inspect.getsource(wrapper.EfficientPeakEstimate.peak_between)
    assert list(inspect.signature(memory.compute_memory_timeline).parameters) == [
        "nodes",
        "name_to_freeable_input_buf",
        "graph_outputs",
    ]
    fields = [f.name for f in dataclasses.fields(memory.BufferInfo)]
    assert fields == ["buffer", "size_alloc", "size_free", "start_step", "end_step"]
    assert callable(segmented_tree.SegmentedTree.summarize_range)
    assert "self.reuses[output_buffer.get_name()] = input_buffer.get_name()" in inspect.getsource(
        wrapper.PythonWrapperCodegen.codegen_inplace_reuse
    )
    assert "self.removed_buffers" in inspect.getsource(graph.GraphLowering.__init__)
    # _flushed_after: what ends a CPU kernel group (``Scheduler.codegen`` flushes before an extern or template)
    from torch._inductor import scheduler

    for name in ("is_extern", "is_template", "get_device"):
        assert callable(getattr(scheduler.BaseSchedulerNode, name)), name
    assert "node.is_extern()" in inspect.getsource(scheduler.Scheduler._codegen)


def test_size_hint_reads_hints_without_guards():
    """``optimization_hint`` (2.12 on) and ``size_hint`` (2.11): a SymInt's hint, the fallback for an unbacked one,
    and no guard either way."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    seven = env.create_symintnode(env.create_symbol(7, ConstantSource("s0")), hint=7)
    assert tp.size_hint(seven) == 7 and tp.size_hint(3) == 3
    assert tp.size_hint(env.create_unbacked_symint()) == tp.UNBACKED_SIZE_FALLBACK
    assert not env.guards


def test_region_memory_budget_annotates_the_traced_ops():
    """``region_memory_budget`` is torch's context manager from 2.13 on, the same ``fx.traceback.annotate`` before:
    the joint graph's ops carry the budget either way."""
    budgets: list = []

    def partition(joint, joint_inputs, **kwargs):
        budgets.extend(tp.memory_budget_annotation(n) for n in joint.graph.nodes if n.op == "call_function")
        return partitioners.default_partition(joint, joint_inputs, **kwargs)

    def fn(x):
        with tp.region_memory_budget(0.25):
            return x.sin().cos()

    torch._dynamo.reset()
    backend = tp.aot_autograd(fw_compiler=noop_compiler, bw_compiler=noop_compiler, partition_fn=partition)
    torch.compile(fn, backend=backend)(torch.randn(8, requires_grad=True)).sum().backward()
    assert 0.25 in budgets


def _bmm(a_shape, b_shape, device="cuda", dtype=torch.float32):
    return (
        SimpleNamespace(shape=a_shape, dtype=dtype, device=torch.device(device)),
        SimpleNamespace(shape=b_shape, dtype=dtype, device=torch.device(device)),
    )


@pytest.mark.parametrize("since_2_13", [False, True])
def test_gpu_dot_bmm_is_a_reduction_from_2_13(since_2_13):
    """The Triton backend's rule, by the torch release it describes: only a dot-shaped bmm (M = N = 1, K <= 32, one
    float dtype) becomes a multiply and a sum, and only from torch 2.13; the C++ backend's: M or N = 1 in every
    release.  The rules follow the release they are given, not the running one (a recorded graph's own)."""
    triton = backend_rules("triton", (2, 13) if since_2_13 else (2, 12))
    assert triton.bmm_is_reduction(*_bmm((8, 1, 16), (8, 16, 1))) == since_2_13
    assert triton.bmm_is_reduction(*_bmm((8, 1, 16), (8, 16, 1), device="xpu")) == since_2_13
    assert not triton.bmm_is_reduction(*_bmm((8, 1, 64), (8, 64, 1)))  # K over 32
    assert not triton.bmm_is_reduction(*_bmm((8, 1, 16), (8, 16, 4)))  # N = 4: an extern bmm on a GPU
    assert not triton.bmm_is_reduction(*_bmm((8, 1, 16), (8, 16, 1), dtype=torch.float64))
    cpp = backend_rules("cpp", (2, 13) if since_2_13 else (2, 12))
    assert cpp.bmm_is_reduction(*_bmm((8, 1, 64), (8, 64, 4), device="cpu"))
    assert not cpp.bmm_is_reduction(*_bmm((8, 2, 64), (8, 64, 4), device="cpu"))
    assert backend_rules("triton").dot_bmm_is_reduction == tp.GPU_DOT_BMM_IS_REDUCTION  # the running release


def test_cpu_bmm_with_one_row_is_a_reduction():
    gm = make_fx(torch.bmm)(torch.randn(4, 1, 8), torch.randn(4, 8, 5))
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert lowering.inductor_class(node, op_class(node), backend=backend_rules("cpp")) is OpClass.REDUCTION


def _embedding_backward_graph() -> fx.GraphModule:
    from torch._inductor.decomposition import select_decomp_table

    def step(weight, indices, grad):
        return torch.ops.aten.embedding_dense_backward(grad, indices, weight.shape[0], -1, False)

    weight, indices, grad = torch.randn(50, 16), torch.randint(0, 50, (4, 12)), torch.randn(4, 12, 16)
    return make_fx(step, decomposition_table=select_decomp_table())(weight, indices, grad)


def test_embedding_gradient_scatter_in_both_decompositions():
    """Inductor's decompositions leave an embedding's gradient as an ``index_put`` in the joint graph (2.11, 2.12) or
    one ``_unsafe_masked_index_put_accumulate`` (2.13 on).  Either way the
    simulator sees a scatter kernel (a reduction) looping over the rows' gradients, which its producer fuses into."""
    gm = _embedding_backward_graph()
    (scatter,) = [n for n in gm.graph.nodes if op_class(n) is OpClass.GATHER]
    assert scatter.target.overloadpacket is tp.EMBEDDING_GRAD_SCATTER.overloadpacket
    assert lowering.inductor_class(scatter, OpClass.GATHER, backend=backend_rules("cpp")) is OpClass.REDUCTION
    values = lowering.scatter_values(scatter)
    assert list(values.meta["val"].shape) == [4, 12, 16]


def test_outer_product_bmm_is_a_multiply_from_2_12():
    """Inductor's ``bmm`` decomposition turns [B, M, 1] x [B, 1, N] into a broadcast multiply from 2.12 (MoE weight
    gradients: ``test_liveness.py``'s TokenExperts); before, the extern bmm's output exists whole."""
    from torch._inductor.decomposition import select_decomp_table

    gm = make_fx(torch.bmm, decomposition_table=select_decomp_table())(torch.randn(4, 8, 1), torch.randn(4, 1, 5))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert (torch.ops.aten.bmm.default not in targets) == tp.BMM_OUTER_PRODUCT_IS_POINTWISE, targets
