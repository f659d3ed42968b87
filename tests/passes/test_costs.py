"""Node costs on traced joint graphs: FLOPs against FlopCounterMode, alias-aware bytes, fusion rule."""

from __future__ import annotations

import pytest
import torch
from conftest import capture_joint
from torch.utils.flop_counter import FlopCounterMode

from fxremat.examples import EXAMPLES, example
from fxremat_passes.costs import PROFILES, annotate_costs, count_flops
from fxremat_passes.ops import OpClass, op_class

CPU = PROFILES["cpu"]


def _materialise(arg):
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.dtype.is_floating_point:
                return torch.randn(val.shape, dtype=val.dtype)
            return torch.zeros(val.shape, dtype=val.dtype)
        return val
    if isinstance(arg, (list, tuple)):
        return type(arg)(_materialise(a) for a in arg)
    return arg


@pytest.mark.parametrize("name", EXAMPLES)
def test_flops_equal_flop_counter_wherever_it_counts(name):
    model, inputs = example(name)
    joint, _ = capture_joint(model, inputs)
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
        counted = counter.get_total_flops()
        if counted:
            assert count_flops(node, cls) == counted, node.format_node()
            checked += 1
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
