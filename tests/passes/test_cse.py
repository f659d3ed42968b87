"""cse.plan_clean_up + CleanUp.apply (what prepare does to the joint itself) against PyTorch's
``eliminate_dead_code`` + ``fx_graph_cse`` on small traced functions, one per rule: what merges, what must not
(random ops, ``empty``, outputs' storages, across an in-place update), how constants and nested arguments are
compared, and the dead code that goes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.cse import live_nodes, plan_clean_up

aten = torch.ops.aten


def dead_code_and_cse(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` (nodes new, meta values shared, as ``Graph.__deepcopy__`` makes it) cleaned up in place."""
    cleaned = copy.deepcopy(graph)
    plan_clean_up(cleaned).apply()
    return cleaned


def across_mutation(x):
    a = x + 1
    y = x.clone()
    y.add_(1)  # a new mutation region: the same add after it is not merged into the one before
    b = x + 1
    c = x + 1
    return a * b * c * y


def constants_by_type(x):
    return (x + 1) * (x + 1.0) * (x + True) * (x + 1)


def random_and_empty(x):
    r = torch.rand_like(x) * torch.rand_like(x)
    e = torch.empty_like(x).fill_(2) + torch.empty_like(x).fill_(2)
    return r + e + torch.bernoulli(x.sigmoid()) + torch.bernoulli(x.sigmoid())


def outputs_stay_apart(x):
    return x.sin(), x.sin(), x.cos() + x.cos()


def nested_arguments(x):
    a = torch.cat([x.sin(), x.sin()]) + torch.cat([x.sin(), x.sin()])
    b = torch.cat([x, x.sin()]) * torch.cat([x.sin(), x])
    return a.sum(dim=[0]) + b.sum(dim=[0]) + b.sum(dim=(0,))


def keyword_arguments(x):
    return x.sum(0, keepdim=True) + x.sum(0, keepdim=True) + x.sum(0, keepdim=False) + x.to(torch.float64).float()


def dead_code(x):
    _unused = x.exp() * 2
    return x.tanh() + x.tanh()


def chain_of_duplicates(x):
    a = x.sin().cos().exp()
    b = x.sin().cos().exp()
    return a * b


CASES = [
    across_mutation,
    constants_by_type,
    random_and_empty,
    outputs_stay_apart,
    nested_arguments,
    keyword_arguments,
    dead_code,
    chain_of_duplicates,
]


def _summary(graph: torch.fx.Graph):
    return [
        (n.name, n.op, str(n.target), str(n.args), str(n.kwargs), n.meta.get("mutation_region_id")) for n in graph.nodes
    ]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_matches_pytorch(fn):
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4, 3))
    ours = dead_code_and_cse(gm.graph)
    theirs = copy.deepcopy(gm.graph)
    theirs.eliminate_dead_code()
    theirs = tp.fx_graph_cse(theirs)
    assert _summary(ours) == _summary(theirs)
    for x, y in zip(ours.nodes, theirs.nodes):
        assert x.meta.keys() == y.meta.keys()
        assert all(x.meta[k] is y.meta[k] or x.meta[k] == y.meta[k] for k in x.meta)


def test_merges_and_keeps_what_it_should():
    gm = make_fx(across_mutation, tracing_mode="fake")(torch.randn(4, 3))
    adds = [n for n in dead_code_and_cse(gm.graph).nodes if n.target is aten.add.Tensor]
    assert len(adds) == 2  # one before the in-place add_, one after (b and c merged)
    gm = make_fx(random_and_empty, tracing_mode="fake")(torch.randn(4, 3))
    graph = dead_code_and_cse(gm.graph)
    assert sum(n.target is aten.rand_like.default for n in graph.nodes) == 2
    assert sum(n.target is aten.bernoulli.default for n in graph.nodes) == 2
    gm = make_fx(outputs_stay_apart, tracing_mode="fake")(torch.randn(4, 3))
    graph = dead_code_and_cse(gm.graph)
    assert sum(n.target is aten.sin.default for n in graph.nodes) == 2  # both are returned
    assert sum(n.target is aten.cos.default for n in graph.nodes) == 1


def test_dead_code_goes_but_impure_nodes_stay():
    gm = make_fx(dead_code, tracing_mode="fake")(torch.randn(4, 3))
    live = {n.target for n in live_nodes(gm.graph)}
    assert aten.exp.default not in live and aten.tanh.default in live, live

    def dead_in_place(x):
        y = x.clone()
        y.add_(1)  # unused, but a mutation: kept
        return x * 2

    gm = make_fx(dead_in_place, tracing_mode="fake")(torch.randn(4, 3))
    assert any(n.target is aten.add_.Tensor for n in live_nodes(gm.graph))
