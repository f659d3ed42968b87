"""Recomputes that Inductor cannot fuse (issue #16): a fusible value read by a backward matmul or attention is a
kernel of its own when recomputed, and the cut prices it so (``costs.stored_when_recomputed``)."""

from __future__ import annotations

import copy

import torch
import torch.fx as fx
from conftest import assert_grads_close, eager_grads, run_aot
from torch.fx.experimental.proxy_tensor import make_fx

import fxremat
from fxremat.examples import LlamaStack
from fxremat.options import Options
from fxremat_passes import costs
from fxremat_passes.ops import OpClass, op_class

SDPA_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _root(node: fx.Node) -> fx.Node:
    while op_class(node) is OpClass.VIEW:
        node = node.args[0]
    return node


def _split_llama():
    """(gradients, backward graph, report) of a one-block Llama stack (RoPE before SDPA) through fxremat."""
    torch.manual_seed(0)
    model, x = LlamaStack(1, 64, heads=4, kv_heads=2, max_seq=16), torch.randn(2, 16, 64)
    graphs, reports = [], []
    partition = fxremat.make_partition_fn(Options.create(), reports)

    def capture(gm, joint_inputs, **kwargs):
        fw, bw = partition(gm, joint_inputs, **kwargs)
        graphs.append(bw)
        return fw, bw

    _, grads, _ = run_aot(copy.deepcopy(model), (x,), capture)
    return model, x, grads, graphs[0], reports[0]


def _query_recomputed(bw: fx.GraphModule) -> bool:
    (sdpa,) = [n for n in bw.graph.nodes if n.target is SDPA_BACKWARD]
    return _root(sdpa.args[1]).op != "placeholder"  # (grad_out, query, key, value, ...): query computed here?


def test_rope_query_is_saved_not_recomputed_for_the_attention_backward(monkeypatch):
    model, x, grads, bw, report = _split_llama()
    assert not _query_recomputed(bw)  # saved where it is computed: no kernel in backward to store it again
    _, expected = eager_grads(model, (x,))
    assert_grads_close(grads, expected)
    # Without the rule the cut recomputes the RoPE'd query (priced as fused into the SDPA backward, which it
    # cannot be) from the saved projection: the same saved bytes, one more backward kernel per query.
    monkeypatch.setattr(costs, "stored_when_recomputed", lambda *args: False)
    *_, bw_before, report_before = _split_llama()
    assert _query_recomputed(bw_before)
    assert report.saved_bytes == report_before.saved_bytes


def test_only_backward_extern_readers_make_a_recompute_a_kernel():
    def f(a, b):
        y = torch.sin(a)  # read by the forward mm and, through a view, by the backward's weight-gradient mm
        return (y.t() @ b).sum()

    gm = make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
    nodes = {n.name: n for n in gm.graph.nodes}
    sin, matmul = nodes["sin"], nodes["mm"]
    assert not costs.stored_when_recomputed(sin, None, set())  # the matmul runs in forward: not a recompute
    assert costs.stored_when_recomputed(sin, None, {matmul})  # a backward matmul reads it
    fused = costs.compute_node_cost(sin, costs.PROFILES["cpu"])
    stored = costs.compute_node_cost(sin, costs.PROFILES["cpu"], backward={matmul})
    assert stored.recompute_seconds == stored.est_seconds > fused.recompute_seconds
