"""MUST_RECOMPUTE holds per storage (issue #23): over generated joint graphs with views, multi-output ops and
random checkpoint tags, no tensor forward hands to backward shares storage with a MUST_RECOMPUTE value, at
``memory_budget`` 1.0, 0.5 and 0.0 and at ``peak_budget=0.0``, unless ``report.tag_conflicts`` names it.

Fast path: each drawn program is traced once (aot_function, no-op compilers, a capturing partitioner); the
tags are drawn onto the joint graph itself (``node.meta["recompute"]``, where selective activation checkpointing
puts them), and fxremat's partition function runs on copies of it, so a graph costs four partitions and no
tracing or eager step.  ``GRAPHS`` graphs per run (``TAG_DRAWS`` tag sets per program).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.fx as fx
from functorch.compile import aot_function
from helpers import noop_compiler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxremat
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.costs import alias_root

Policy = tp.CheckpointPolicy
N = 8  # every tensor is N x N: any op applies to any state entry
TAG_DRAWS = 5
GRAPHS = int(os.environ.get("FXREMAT_TAG_FUZZ_GRAPHS", 500))
CONFIGS = {
    "budget 1.0": dict(memory_budget=1.0),
    "budget 0.5": dict(memory_budget=0.5),
    "budget 0.0": dict(memory_budget=0.0),
    "peak 0.0": dict(peak_budget=0.0),
}
TAGS = (None, None, Policy.MUST_RECOMPUTE, Policy.MUST_RECOMPUTE, Policy.PREFER_RECOMPUTE, Policy.MUST_SAVE)


def _split_cat(a):
    top, bottom = a.split(N // 2)  # a multi-output view op
    return torch.cat([bottom, top])


def _var_mean(a):
    var, mean = torch.var_mean(a, dim=1, keepdim=True)  # a multi-output op that is not a view
    return (a - mean) * var


UNARY = {
    "t": lambda a: a.t(),
    "transpose": lambda a: a.transpose(0, 1).contiguous(),
    "view": lambda a: a.reshape(-1).view(N, N),
    "narrow_expand": lambda a: a.narrow(0, 0, 1).expand(N, N),
    "sin": torch.sin,
    "relu": torch.relu,
    "exp_half": lambda a: torch.exp(a * 0.5),
    "split_cat": _split_cat,
    "var_mean": _var_mean,
    "sum_expand": lambda a: a.sum(0, keepdim=True).expand(N, N),
}
BINARY = {"mm": torch.mm, "mul": torch.mul, "add": torch.add}


@st.composite
def programs(draw):
    steps = []
    for k in range(draw(st.integers(2, 9))):
        size = k + 2  # the state: x, w, then one entry per step
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(BINARY))), size - 1, draw(st.integers(0, size - 1))))
        else:
            steps.append((draw(st.sampled_from(sorted(UNARY))), draw(st.integers(max(0, size - 3), size - 1))))
    outputs = tuple(sorted({len(steps) + 1, draw(st.integers(2, len(steps) + 1))}))
    return tuple(steps), outputs


def run_program(program, x, w):
    steps, outputs = program
    state = [x, w]
    for op, *args in steps:
        fn = BINARY.get(op) or UNARY[op]
        state.append(fn(*(state[i] for i in args)))
    return tuple(state[i] for i in outputs)


_JOINTS: dict = {}


def joint_of(program):
    """(joint graph, joint inputs, partitioner kwargs) of one program, traced once."""
    if program not in _JOINTS:
        captured = {}

        def capture(gm, joint_inputs, **kwargs):
            captured.update(gm=copy.deepcopy(gm), inputs=joint_inputs, kwargs=kwargs)
            return tp.default_partition(gm, joint_inputs, **kwargs)

        f = aot_function(
            lambda x, w: run_program(program, x, w),
            fw_compiler=noop_compiler,
            bw_compiler=noop_compiler,
            partition_fn=capture,
        )
        torch.manual_seed(0)
        x, w = torch.randn(N, N, requires_grad=True), torch.randn(N, N, requires_grad=True)
        outs = f(x, w)
        # the gradient of each output's sum, laid out as the output is: torch 2.12.1's AOTAutograd copies a tangent
        # into the output's strides and fails on an expanded output (stride 0) when the tangent's differ
        spans = [1 + sum((n - 1) * s for n, s in zip(o.shape, o.stride())) for o in outs]
        tangents = [torch.ones(span).as_strided(o.shape, o.stride()) for o, span in zip(outs, spans)]
        torch.autograd.backward(outs, tangents)
        _JOINTS[program] = captured
    return _JOINTS[program]


def tangent_free(gm: fx.GraphModule) -> list[fx.Node]:
    """call_function nodes that do not depend on a tangent: where checkpoint tags can be."""
    backward: set[fx.Node] = set()
    out = []
    for node in gm.graph.nodes:
        if tp.is_tangent(node) or any(a in backward for a in node.all_input_nodes):
            backward.add(node)
        elif node.op == "call_function":
            out.append(node)
    return out


def check_tags_hold(joint, tags, config: dict) -> None:
    gm = copy.deepcopy(joint["gm"])
    for node, tag in zip(tangent_free(gm), tags):
        if tag is not None:
            node.meta["recompute"] = tag
    reports: list = []
    partition = fxremat.make_partition_fn(Options.create(strict=True, **config), reports)
    fw, _ = partition(gm, joint["inputs"], **joint["kwargs"])
    (report,) = reports
    tagged = [n for n in gm.graph.nodes if n.meta.get("recompute") == Policy.MUST_RECOMPUTE]
    roots = {alias_root(n): n for n in tagged if alias_root(n).op != "placeholder"}
    by_name = {n.name: n for n in gm.graph.nodes}
    conflicts = {name for name, _ in report.tag_conflicts}
    num_fwd_outputs = joint["kwargs"]["num_fwd_outputs"]
    saved = [a for a in fw.graph.output_node().args[0][num_fwd_outputs:] if isinstance(a, fx.Node)]
    for value in saved:
        node = by_name.get(value.name)
        if node is None or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        root = alias_root(node)
        if root in roots:
            assert {node.name, root.name, roots[root].name} & conflicts, (
                f"{config}: saved {node.format_node()}, which shares the storage of {roots[root].format_node()} "
                f"(tagged MUST_RECOMPUTE), and no tag conflict says so: {report.tag_conflicts}"
            )


@settings(
    max_examples=max(1, GRAPHS // TAG_DRAWS),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(program=programs(), data=st.data())
def test_no_must_recompute_storage_is_saved(program, data):
    joint = joint_of(program)
    count = len(tangent_free(joint["gm"]))
    for _ in range(TAG_DRAWS):
        tags = data.draw(st.lists(st.sampled_from(TAGS), min_size=count, max_size=count))
        for config in CONFIGS.values():
            check_tags_hold(joint, tags, config)


def test_checkpoint_plans_leave_unsaveable_values_recomputable():
    """A checkpoint's open set holds ``exp``, which MUST_RECOMPUTE (on ``detach_1``, a view of it) forbids saving,
    and backward reads it: the checkpointed candidate must leave it recomputable (``checkpoints.with_checkpoints``),
    or the cut is infeasible (it raised InfeasibleCutError under strict=True before)."""
    program = ((("narrow_expand", 0), ("exp_half", 0)), (2, 3))
    joint = joint_of(program)
    tags = [None, None, Policy.MUST_RECOMPUTE, None, None, Policy.MUST_RECOMPUTE]
    check_tags_hold(joint, tags, dict(memory_budget=0.5))
