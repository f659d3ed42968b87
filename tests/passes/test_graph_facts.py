"""GraphFacts (passes/graph/graph_facts.py): each fact equals what the pass that used to compute it computes from the
graph, and facts are reused only while the graph keeps the nodes they were built from.  No Inductor."""

from __future__ import annotations

import copy

import torch
from helpers import capture_joint

from fxremat.examples import Stack
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph import graph_facts
from fxremat_passes.graph.costs import alias_root, value_nbytes
from fxremat_passes.graph.cse import prepare_joint_graph
from fxremat_passes.graph.ops import op_class
from fxremat_passes.graph.roles import classify
from fxremat_passes.rewrite.split import joint_facts
from fxremat_passes.simulator.backends import backend_rules
from fxremat_passes.simulator.lowering import inductor_class
from fxremat_passes.simulator.node_facts import joint_tables
from fxremat_passes.simulator.phase_graph import storage_bytes as value_storage_bytes


def _joint():
    torch.manual_seed(0)
    gm, kwargs = capture_joint(Stack(depth=2, dim=32), (torch.randn(2, 8, 32),))
    return prepare_joint_graph(gm), kwargs["num_fwd_outputs"]


def test_each_fact_is_the_graphs_own():
    joint, n = _joint()
    facts = graph_facts.GraphFacts(joint, n)
    nodes = list(joint.graph.nodes)
    assert list(facts.nodes) == nodes and all(facts.index[v] == i for i, v in enumerate(nodes))
    fwd, bwd = tp.extract_fwd_bwd_outputs(joint, n)
    assert facts.fwd_outputs == fwd and facts.bwd_outputs == bwd
    assert facts.primals == [v for v in nodes if tp.is_primal(v)]
    assert facts.tangents == [v for v in nodes if tp.is_tangent(v)]
    cpp = backend_rules("cpp")
    storage_bytes, inductor_classes = joint_tables(facts, cpp)  # the simulator's tables, derived from the facts
    for v in nodes:
        assert facts.inputs_of[v] == v.all_input_nodes
        assert facts.users_of[v] == tuple(v.users)
        assert facts.op_class[v] is op_class(v)
        assert facts.alias_root[v] is alias_root(v)
        assert inductor_classes[v] is inductor_class(v, op_class(v), backend=cpp)
        assert facts.nbytes[v] == value_nbytes(v.meta.get("val"))
        assert storage_bytes[v] == value_storage_bytes(v, cpp)
    assert any(facts.alias_root[v] is not v for v in nodes)  # the stack has views


def test_attached_facts_serve_every_pass_until_the_graph_changes():
    joint, n = _joint()
    facts = graph_facts.attach(joint, n)
    roles = classify(joint, num_fwd_outputs=n, static_lifetime_input_indices=None)
    assert roles.facts is facts and graph_facts.graph_facts(joint, n) is facts
    assert joint_facts(joint, n) is joint_facts(joint, n)  # one _Joint for every split of the partition
    assert graph_facts.graph_facts(joint, n + 1) is not facts  # other outputs: other facts
    assert graph_facts.attached(copy.deepcopy(joint).graph) is None  # a copy carries none
    node = next(v for v in joint.graph.nodes if v.op == "call_function")
    with joint.graph.inserting_after(node):
        joint.graph.call_function(torch.ops.aten.clone.default, (node,))
    assert graph_facts.attached(joint.graph) is None  # a changed graph: built again
