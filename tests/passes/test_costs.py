"""Node costs on traced joint graphs: FLOPs against FlopCounterMode, alias-aware bytes, fusion rule."""

from __future__ import annotations

import bench_models  # benchmarks/ (tests/conftest.py puts it on the path)
import pytest
import torch
from cost_model import materialise  # noqa: E402  (benchmarks/investigations/)
from helpers import aot_eager, capture_joint
from torch.utils.flop_counter import FlopCounterMode

from fxremat.examples import EXAMPLES, example
from fxremat_passes.graph.costs import PROFILES, annotate_costs, count_flops
from fxremat_passes.graph.ops import OpClass, op_class

CPU = PROFILES["cpu"]
# real tensors of each node's hinted shapes (benchmarks/ is on sys.path: tests/conftest.py)
_materialise = materialise


@pytest.mark.parametrize("name", EXAMPLES)
def test_flops_equal_flop_counter_wherever_it_counts(name):
    model, inputs = example(name)
    joint, _ = capture_joint(model, inputs)
    checked = _check_flops_against_counter(joint)
    if name != "dropout":
        assert checked > 0


def test_views_cost_their_root_storage_and_views_of_inputs_cost_nothing():
    model, inputs = example("block_sdpa")
    joint, _ = capture_joint(model, inputs)
    costs = annotate_costs(joint.graph, CPU)
    for node, cost in costs.items():
        if cost.op_class is OpClass.VIEW:
            root = next(n for n in joint.graph.nodes if n.name == cost.alias_root)
            if root.op == "placeholder":
                assert cost.storage_nbytes == 0, node.format_node()
            else:
                assert cost.storage_nbytes == costs[root].nbytes, node.format_node()
            assert cost.recompute_seconds == 0.0 and cost.flops == 0


def test_fusion_rule_pointwise_recompute_costs_flops_only():
    model, inputs = example("mlp")
    joint, _ = capture_joint(model, inputs)
    costs = annotate_costs(joint.graph, CPU)
    pointwise = [c for c in costs.values() if c.op_class is OpClass.POINTWISE and c.flops]
    matmuls = [c for c in costs.values() if c.op_class is OpClass.MATMUL]
    assert pointwise and matmuls
    for c in pointwise:
        assert c.recompute_seconds == pytest.approx(c.flops / CPU.peak_flops(None))
        assert c.recompute_seconds < c.est_seconds  # fused: no memory round trip
    for c in matmuls:
        assert c.recompute_seconds == c.est_seconds  # its own kernel: roofline


class ConvVariants(torch.nn.Module):
    """conv1d, a grouped conv2d and a transposed conv2d: FLOP formulas for every dimension, groups, transposed."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.t2 = torch.nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, x):
        y = self.c1(x)  # (B, 8, 16)
        y = self.c2(y.view(y.shape[0], 8, 4, 4))
        return self.t2(y)


def _check_flops_against_counter(joint) -> int:
    checked = 0
    for node in joint.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        cls = op_class(node)
        if cls in (OpClass.RANDOM, OpClass.MUTATION):
            continue
        args, kwargs = _materialise(node.args), {k: _materialise(v) for k, v in node.kwargs.items()}
        with FlopCounterMode(display=False) as counter:
            node.target(*args, **kwargs)
        if counter.get_total_flops():
            assert count_flops(node, cls) == counter.get_total_flops(), node.format_node()
            checked += 1
    return checked


def test_convolution_flops_any_dims_groups_transposed():
    joint, _ = capture_joint(ConvVariants(), (torch.randn(2, 4, 16),))
    convs = [n for n in joint.graph.nodes if "convolution" in str(n.target)]
    assert len(convs) >= 6  # three forward, three backward
    assert _check_flops_against_counter(joint) >= 6


class LossOf(torch.nn.Module):
    """A transformers model called positionally (``keys``: its keyword arguments in order), returning its loss."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, tuple(keys)

    def forward(self, *args):
        return self.model(**dict(zip(self.keys, args))).loss


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert", "vit", "t5"])
def test_flops_equal_flop_counter_on_transformers_models(arch):
    """The tests' shape of benchmarks/bench_models.py's transformers models (``TEST_SHAPE``: one layer, 64 wide)."""
    pytest.importorskip("transformers")
    work = bench_models.hf_workload(arch, bench_models.TEST_SHAPE)
    _check_transformers_flops(LossOf(work.model, work.kwargs), tuple(work.kwargs.values()))


def _mixtral(experts_implementation: str, dtype: torch.dtype):
    pytest.importorskip("transformers")
    shape = dict(bench_models.TEST_SHAPE, experts=2)  # two experts, both picked for every token
    try:
        model = bench_models.hf_model("mixtral", shape, experts_implementation=experts_implementation)
    except (TypeError, ValueError) as error:
        pytest.skip(f"this transformers has no experts_implementation={experts_implementation!r}: {error}")
    return LossOf(model.to(dtype), ("input_ids", "labels"))


@pytest.mark.parametrize(
    "experts, dtype",
    [("batched_mm", torch.float32), ("grouped_mm", torch.bfloat16)],
    ids=["batched_mm-fp32", "grouped_mm-bf16"],
)
def test_flops_equal_flop_counter_on_mixtral(experts, dtype):
    """Mixtral's experts: one bmm over the picked experts' gathered weights, or (bf16 under compile: transformers
    takes torch's grouped_mm only then) aten._grouped_mm, which FlopCounterMode does not count: checked against
    the same product done group by group with mm."""
    torch.manual_seed(0)
    shape = bench_models.TEST_SHAPE
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))
    graph = _check_transformers_flops(_mixtral(experts, dtype), (ids, ids))
    grouped = [n for n in graph.graph.nodes if n.target is torch.ops.aten._grouped_mm.default]
    if experts == "grouped_mm":
        assert grouped, "no aten._grouped_mm in the joint graph: transformers took another path"
    else:  # the bmm over gathered expert weights is there, and _check_transformers_flops compared it
        assert any(n.target is torch.ops.aten.bmm.default for n in graph.graph.nodes)
    for node in grouped:
        assert count_flops(node, op_class(node)) == _grouped_mm_flops_by_group(node), node.format_node()


def _grouped_mm_flops_by_group(node) -> int:
    """FlopCounterMode's count of one aten._grouped_mm done as one mm per group (meta tensors, even groups)."""
    a, b = (torch.empty(x.meta["val"].shape, device="meta") for x in node.args[:2])
    groups = node.args[2].meta["val"].shape[0]
    split_dim = {(2, 3): (a, 0), (3, 2): (b, 1), (2, 2): (a, 1)}.get((a.dim(), b.dim()))
    with FlopCounterMode(display=False) as counter:
        if split_dim is None:  # 3-D by 3-D: a batch of products
            torch.bmm(a, b)
        else:
            tensor, dim = split_dim
            bounds = [round(i * tensor.shape[dim] / groups) for i in range(groups + 1)]
            for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                if a.dim() == 2 and b.dim() == 3:
                    torch.mm(a[lo:hi], b[g])
                elif a.dim() == 3:
                    torch.mm(a[g], b[:, lo:hi])
                else:
                    torch.mm(a[:, lo:hi], b[lo:hi])
    return counter.get_total_flops()


def _check_transformers_flops(module, args):
    # through Dynamo (aot_module cannot take tied weights), capturing the joint graph AOTAutograd builds
    from fxremat_passes import _torch_private as tp

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        captured["gm"] = tp.copy_graph_module(gm)
        return tp.default_partition(gm, joint_inputs, **kwargs)

    backend = aot_eager(partition_fn)
    # a fresh Dynamo: LossOf.forward, compiled before for another model, would come back with dynamic sizes
    torch._dynamo.reset()
    torch.compile(module, backend=backend)(*args).backward()
    assert _check_flops_against_counter(captured["gm"]) > 0
    return captured["gm"]


# The CUDA attention kernels, traced on meta tensors (their meta kernels need no GPU): forward and backward.
CUDA_SDPA = {
    "flash": lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0],
    "efficient": lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)[
        0
    ],
    "cudnn": lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)[0],
}


def _plain_meta(arg):
    """A node's value as a plain meta tensor (make_fx records FakeTensors of its own mode)."""
    if not isinstance(arg, torch.fx.Node):
        return arg
    val = arg.meta["val"]
    if not isinstance(val, torch.Tensor):
        return val
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")


@pytest.mark.parametrize("variant", sorted(CUDA_SDPA))
def test_flops_equal_flop_counter_on_cuda_attention_variants(variant):
    from torch.fx.experimental.proxy_tensor import make_fx

    attention = CUDA_SDPA[variant]

    def forward_and_backward(q, k, v):
        out = attention(q, k, v)
        return torch.autograd.grad(out.sum(), (q, k, v))

    q, k, v = (torch.empty(2, 4, 128, 64, device="meta", dtype=torch.float16, requires_grad=True) for _ in range(3))
    graph = make_fx(forward_and_backward)(q, k, v)
    checked = set()
    for node in graph.graph.nodes:
        if node.op != "call_function" or "scaled_dot_product" not in str(node.target):
            continue
        meta_args = torch.utils._pytree.tree_map(_plain_meta, (node.args, node.kwargs))
        with FlopCounterMode(display=False) as counter:
            node.target(*meta_args[0], **meta_args[1])
        assert counter.get_total_flops() > 0, node.format_node()
        assert count_flops(node, op_class(node)) == counter.get_total_flops(), node.format_node()
        checked.add("backward" if "backward" in str(node.target) else "forward")
    assert checked == {"forward", "backward"}
