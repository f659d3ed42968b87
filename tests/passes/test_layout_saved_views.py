"""Issue #19: a forward input read by a convolution and saved for backward must reach backward as itself, not as
the channels-last copy Inductor makes of it (``passes/simulator/layout.py``: ``saved_inputs_as_views``).

Under layout optimisation Inductor gives a forward output channels-last strides when the output's node is one a
convolution reads (``GraphLowering.run_node``: ``is_output`` and ``nodes_prefer_channels_last``); a placeholder has
fixed strides, so a saved weight comes back as a copy and autograd keeps the copy.  The forward "compiler" here
does the same to the graphs it is given, without Inductor: a forward output that is a placeholder read by a 2-D
convolution is returned as a channels-last copy; every other output as computed.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from functorch.compile import make_boxed_func

import fxremat
from fxremat.measure import max_relative_error, measure_saved
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes.graph.ops import CONVOLUTION
from fxremat_passes.rewrite.layout_pins import saved_inputs_as_views


def _conv_read_placeholders(gm) -> set:
    return {a for n in gm.graph.nodes if n.target is CONVOLUTION for a in n.args[:2] if a.op == "placeholder"}


def _inductor_like(gm, example_inputs):
    """Forward: outputs that are placeholders read by a convolution come back channels-last copies (Inductor's
    output-stride rule under layout optimisation).  Backward: run as traced."""
    run = make_boxed_func(gm.forward)
    if any(tp.is_tangent(n) for n in gm.graph.find_nodes(op="placeholder")):
        return run
    read = _conv_read_placeholders(gm)
    copied = [isinstance(o, torch.fx.Node) and o in read for o in gm.graph.output_node().args[0]]

    def forward(args):
        outs = run(args)
        return [o.clone(memory_format=torch.channels_last) if c else o for o, c in zip(outs, copied)]

    forward._boxed_call = True
    return forward


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 8, 3, padding=1),
    )


def _pytorch_split():
    """(forward, backward) of ``_net`` as PyTorch's partitioner splits it for Inductor, before any rewrite."""
    torch._dynamo.reset()
    graphs: list = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def partition_fn(joint, inputs, **kwargs):
        return tp.pytorch_default_partition(joint, inputs, **kwargs)

    model, x = _net(), torch.randn(2, 3, 8, 8)
    torch.compile(model, backend=tp.aot_autograd_as_inductor(partition_fn, keep))(x).sum().backward()
    return graphs


def _step(model, x, backend):
    compiled = torch.compile(model, backend=backend)
    exclude = [*model.parameters(), *model.buffers(), x]
    out, saved = measure_saved(lambda: compiled(x), exclude)
    out.square().mean().backward()
    return saved, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_saved_weights_are_the_parameters_not_their_layout_copies():
    torch._dynamo.reset()
    model, x = _net(), torch.randn(2, 3, 8, 8)
    eager = copy.deepcopy(model)
    eager(x).square().mean().backward()
    reports: list = []
    options = Options.create(compare_default=False, strict=True)
    partition_fn = fxremat.make_partition_fn(options, reports, as_inductor=True)
    saved, grads = _step(model, x, tp.aot_autograd_as_inductor(partition_fn, _inductor_like))
    # without the views: copies of the image and the three weights on top of what the report counts
    assert saved.nbytes == reports[0].saved_bytes
    for name, p in eager.named_parameters():
        assert max_relative_error(grads[name], p.grad) < 1e-5, name


def test_only_saved_conv_inputs_become_views():
    """The rewrite on a split: saved placeholders read by a convolution become flat views (forward) viewed back
    (backward); other saved values and the user's outputs stay as they were."""
    fw, bw = _pytorch_split()
    outputs = list(fw.graph.output_node().args[0])
    read = _conv_read_placeholders(fw)
    before = [o for o in outputs[1:] if o in read]
    assert len(before) == 4  # the three conv weights, and the image (the first weight's gradient reads it)
    assert saved_inputs_as_views(fw, bw, 1) == 4
    after = list(fw.graph.output_node().args[0])
    assert after[0] is outputs[0] and not read.intersection(after)
    flat = [o for o in after if o.target is torch.ops.aten.view.default]
    assert sorted(f.args[0].name for f in flat) == sorted(p.name for p in before)
    assert all(f.meta["val"].dim() == 1 for f in flat)
    view = torch.ops.aten.view.default
    views_back = [n for n in bw.graph.nodes if n.target is view and n.args[0].op == "placeholder"]
    assert len(views_back) == 4 and all(n.meta["val"].dim() == 4 for n in views_back)


def test_the_simulator_reads_a_split_as_fxremats_compile_will_rewrite_it():
    """``simulate_step`` of a split not yet rewritten (a plan's, as the planner ranks it) counts what the compile's
    rewrite leaves: no copy kept from forward, one made in backward before its first reader; so it equals the
    simulation of the rewritten split.  PyTorch's split as stock Inductor compiles it (``recopy=False``) keeps the
    copies (the report's baseline)."""
    from fxremat_passes.simulator.liveness import simulate_step

    fw, bw = _pytorch_split()
    stock = simulate_step(fw, bw, 1, recopy=False)
    planned = simulate_step(fw, bw, 1)
    assert saved_inputs_as_views(fw, bw, 1) == 4
    rewritten = simulate_step(fw, bw, 1)
    assert planned.peak_bytes == rewritten.peak_bytes
    # as backward's first kernel (the last convolution's backward) runs, the stock split still holds the copies of
    # the three weights and the image from forward; fxremat's compile holds only the last weight's, just made
    copies = 4 * (3 * 3 * 3 * 16 + 3 * 3 * 16 * 32 + 3 * 3 * 32 * 8) + 4 * 2 * 3 * 8 * 8
    last_weight = 4 * 3 * 3 * 32 * 8

    def backward_start(peak):
        return next(total for phase, _, total in peak.timeline if phase == "backward")

    assert backward_start(stock) - backward_start(planned) == copies - last_weight
