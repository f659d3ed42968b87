"""benchmarks/hoisted_recompute.py's order: a recompute moves before the extern kernels ahead of it, never above an
input it reads, and what reads an extern stays after it.  The compiles themselves are a diagnostic run by hand."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.fx as fx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hoisted_recompute  # noqa: E402

from fxremat_passes.graph.ops import OpClass  # noqa: E402

aten = torch.ops.aten


def _graph():
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    def call(name, target, *args):
        return graph.create_node("call_function", target, args, name=name)

    grad = call("mm", aten.mm.default, a, b)
    weight_grad = call("mm_1", aten.mm.default, grad, b)
    recompute = call("relu", aten.relu.default, a)
    recompute_2 = call("mul", aten.mul.Tensor, recompute, recompute)
    reads_grad = call("add", aten.add.Tensor, recompute_2, grad)
    graph.output((weight_grad, reads_grad))
    classes = {grad: OpClass.MATMUL, weight_grad: OpClass.MATMUL, recompute: OpClass.POINTWISE}
    classes.update({recompute_2: OpClass.POINTWISE, reads_grad: OpClass.POINTWISE})
    return graph, SimpleNamespace(classes=classes)


def test_a_recompute_moves_before_the_externs_ahead_of_it_and_a_reader_of_them_stays():
    graph, phase = _graph()
    order = hoisted_recompute.one_stretch_earlier(list(graph.nodes), phase)
    names = [n.name for n in order]
    assert names.index("relu") < names.index("mm") and names.index("mul") < names.index("mm")
    assert names.index("relu") < names.index("mul")  # never above what it reads
    assert names.index("add") > names.index("mm")  # it reads the extern's output
    assert names[:2] == ["a", "b"] and names[-1] == "output"
    assert sorted(names) == sorted(n.name for n in graph.nodes)


def test_a_recompute_never_moves_past_a_write():
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    write = graph.create_node("call_function", aten.copy_.default, (a, b), name="copy_")
    grad = graph.create_node("call_function", aten.mm.default, (b, b), name="mm")
    recompute = graph.create_node("call_function", aten.relu.default, (a,), name="relu")
    graph.output((write, grad, recompute))
    classes = {write: OpClass.MUTATION, grad: OpClass.MATMUL, recompute: OpClass.POINTWISE}
    names = [n.name for n in hoisted_recompute.one_stretch_earlier(list(graph.nodes), SimpleNamespace(classes=classes))]
    assert names.index("relu") > names.index("copy_")  # it reads ``a``, which the copy writes
