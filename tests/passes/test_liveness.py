"""The step-memory simulator on real splits: invariants, and an exact figure on a model small enough to count."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
from helpers import run_fxremat_aot

from fxremat.examples import example
from fxremat_passes import _torch_private as tp


def test_simulated_step_invariants_on_the_examples():
    for name in ("mlp", "block_sdpa", "stack", "convnet"):
        model, inputs = example(name)
        report = run_fxremat_aot(model, inputs, strict=True, compare_default=True)[3][0]
        timeline = [b for _, _, b in report.memory_timeline]
        assert report.simulated_peak_bytes >= max(timeline) >= 0, name
        assert report.simulated_peak_bytes >= report.saved_bytes, name  # saved values are live at backward start
        assert 0 <= report.simulated_activation_peak_bytes <= report.simulated_peak_bytes, name
        assert report.simulated_peak_at.split(":")[0] in ("forward", "backward"), name
        assert report.baseline_simulated_peak_bytes >= report.baseline_saved_bytes, name


class TwoLinear(nn.Module):
    """x -> fc1 -> relu -> fc2, no biases: every buffer is countable by hand."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32, bias=False)
        self.fc2 = nn.Linear(32, 4, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_exact_peak_of_a_small_model_counted_by_hand():
    """At memory_price 0 fxremat keeps fc1's output h (16x32 floats = 2048 B) and recomputes relu(h) in backward.
    Backward then holds h, the tangent (16x4 = 256 B) and fc2's weight gradient (4x32 = 512 B) when it computes
    the gradient of relu's output (16x32 = 2048 B); relu(h) was freed after its last reader, and the threshold
    backward runs in place over that gradient.  Peak: 2048 + 256 + 512 + 2048 = 4864 B.  Without the gradient
    live then, 4352 B: the activation peak, which forward also reaches (h, relu(h) and the 256 B output)."""
    model, inputs = TwoLinear(), (torch.randn(16, 8),)
    report = run_fxremat_aot(model, inputs, memory_price=0.0, strict=True)[3][0]
    assert report.saved_bytes == 2048
    assert report.simulated_peak_bytes == 4864
    assert report.simulated_peak_at.startswith("backward:")
    assert report.simulated_activation_peak_bytes == 4352


def test_peak_budget_is_met_monotone_and_keeps_gradients():
    import warnings

    from helpers import assert_grads_close, eager_grads

    from fxremat import FxrematBudgetWarning

    model, inputs = example("stack")
    _, expected = eager_grads(model, inputs)
    default = run_fxremat_aot(model, inputs, strict=True, compare_default=False)[3][0]
    peaks, met = [], []
    for fraction in (1.0, 0.9, 0.8, 0.5, 0.1):
        budget = int(default.simulated_peak_bytes * fraction)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, grads, _, reports = run_fxremat_aot(model, inputs, peak_budget=budget, strict=True)
        assert_grads_close(grads, expected)
        report = reports[0]
        warned = [w for w in caught if issubclass(w.category, FxrematBudgetWarning)]
        if report.peak_budget_met:
            assert report.simulated_peak_bytes <= budget and not warned
        else:
            assert len(warned) == 1
        peaks.append(report.simulated_peak_bytes)
        met.append(report.peak_budget_met)
    assert met[:3] == [True, True, True], met  # measured: 1.0, 0.9 and 0.8 are met; 0.5 and 0.1 are not
    assert peaks == sorted(peaks, reverse=True), peaks
    assert peaks[-1] < peaks[0]


def _measured_step_peak(model, inputs, backend) -> int:
    from fxremat.measure import cpu_peak_bytes

    compiled = torch.compile(model, backend=backend)

    def step():
        compiled(*inputs).sum().backward()

    for _ in range(2):
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)  # outside the window, as benchmarks/investigations/peak_memory.py does
    return cpu_peak_bytes(step)


@pytest.mark.inductor
def test_simulated_peak_matches_the_profiler_measured_peak_under_inductor():
    """The simulation against the CPU profiler's memory events of the real Inductor step, both splits.  The MLP is
    the case that was 15% high before fusion was modelled: fxremat recomputes GELU in backward, Inductor fuses it
    with GELU's backward through their shared read of the saved input, and that input dies before the weight
    gradient's matmul, which sat between them in graph order."""
    import copy

    import fxremat

    for name in ("mlp", "block_sdpa"):
        torch.manual_seed(0)
        model, inputs = example(name, dim=256, seq=128)
        default_model = copy.deepcopy(model)
        backend = fxremat.backend(compare_default=True)  # the report's simulation of PyTorch's split too
        measured = _measured_step_peak(model, inputs, backend)
        report = backend.reports[0]
        assert report.recomputed, name  # fxremat's split differs from PyTorch's
        assert abs(report.simulated_peak_bytes - measured) <= 0.02 * measured, (name, report.simulated_peak_bytes)
        measured_default = _measured_step_peak(default_model, inputs, "inductor")
        simulated_default = report.baseline_simulated_peak_bytes
        assert abs(simulated_default - measured_default) <= 0.02 * measured_default, (name, simulated_default)


# The default plan that keeps the first convolution's output (no compute-bound recompute, DESIGN §4.5) simulates
# 4.5% under the measured peak laid out channels-last (299,944 B against 313,968, torch 2.11 and 2.13 alike); the
# plan that recomputed it was within 2%.  A known gap, not yet traced to its buffer: strict, so that its fix is seen.
_KEPT_CONVOLUTION_GAP = pytest.mark.xfail(
    reason="the kept convolution's channels-last step holds a buffer the simulator misses", strict=True
)


@pytest.mark.inductor
@pytest.mark.parametrize(
    "layout, tolerance",
    [pytest.param({"layout_optimization": True}, 0.02, marks=_KEPT_CONVOLUTION_GAP), ({}, 0.05)],
    ids=["channels_last", "contiguous"],
)
def test_convnet_simulated_peak_counts_inductors_channels_last_copies(layout, tolerance):
    """Inductor's layout optimisation (asked for: fxremat's CPU compiles are contiguous otherwise) copies the conv
    input and weights to channels-last and saves the copies for backward; mkldnn's channels-last convolution_backward
    holds two extra weight-sized buffers while it returns the weight gradient (the measured peak).  Without those the
    simulation was 13% low.  Contiguous (fxremat's default on the CPU), mkldnn reorders the input and the output
    gradient instead (``layout._blocked_reorder_bytes``): without them 32% low, with them 4.2% low at this size (the
    reorders are mkldnn's choice, modelled from four measured shapes) and exact at the benchmarks' size."""
    import fxremat

    torch.manual_seed(0)
    model, inputs = example("convnet", dim=256, seq=128)
    backend = fxremat.backend(layout)
    measured = _measured_step_peak(model, inputs, backend)
    report = backend.reports[0]
    assert abs(report.simulated_peak_bytes - measured) <= tolerance * measured, (report.simulated_peak_bytes, measured)


def test_channels_last_copies_are_the_placeholders_a_2d_convolution_reads():
    from fxremat_passes.simulator.backends.mkldnn import workspace_bytes
    from fxremat_passes.simulator.inputs import SimulatorInputs
    from fxremat_passes.simulator.layout import channels_last_copies

    captured = {}

    def partition_fn(gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import default_partition

        captured["fw"], captured["bw"] = default_partition(gm, joint_inputs, **kwargs)
        return captured["fw"], captured["bw"]

    from helpers import run_aot

    model, inputs = example("convnet")  # conv1 3->16, conv2 16->16, 3x3; input (4, 3, 16, 16)
    run_aot(model, inputs, partition_fn)
    fw, bw = captured["fw"], captured["bw"]
    copies = channels_last_copies(fw, SimulatorInputs.default("cpu"))
    convs = [n for n in fw.graph.nodes if n.target is torch.ops.aten.convolution.default]
    expected = {a.name for c in convs for a in c.args[:2] if a.op == "placeholder"}
    assert set(copies) == expected and len(expected) == 3  # x, conv1.weight, conv2.weight
    assert sorted(copies.values()) == [16 * 3 * 9 * 4, 16 * 16 * 9 * 4, 4 * 3 * 16 * 16 * 4]
    backward_convs = [n for n in bw.graph.nodes if n.target is torch.ops.aten.convolution_backward.default]
    assert sorted(workspace_bytes(n, channels_last=True) for n in backward_convs) == [2 * 1728, 2 * 9216]
    # contiguous: mkldnn's blocked reorders of the input and the output gradient (4x16x16x16 each for conv2)
    image, activation = 4 * 3 * 16 * 16 * 4, 4 * 16 * 16 * 16 * 4
    contiguous = sorted(workspace_bytes(n, channels_last=False) for n in backward_convs)
    assert contiguous == [image + activation, 2 * activation]


class TokenExperts(torch.nn.Module):
    """MoE experts applied one token at a time, as transformers' batched_mm Mixtral does: gather each token's expert
    weight (tokens x out x in) and multiply by the token (a bmm with one column per batch)."""

    def __init__(self, experts: int = 4, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.experts = experts

    def forward(self, x):
        route = (x.sum(-1) > 0).long() % self.experts + (x[:, 0] > 0).long()
        y = torch.bmm(self.w[route], x.unsqueeze(-1)).squeeze(-1)
        return torch.nn.functional.silu(y)


@pytest.mark.inductor
def test_moe_gathered_expert_weights_never_exist_whole_under_inductor():
    """On CPU Inductor lowers a bmm with one column per batch to a multiply and a sum, into which the gather of
    expert weights fuses, and the weight gradient's outer product fuses into its index_put: fxremat's split (which
    recomputes the gather) never holds the tokens x hidden x dim tensor.  The simulation said 534 MiB for Mixtral
    (measured 20.5 MiB) before modelling that.  Backward does hold one tokens x hidden buffer: the SiLU's sigmoid,
    read twice, is stored (``should_realize_on_reuse``), and the index_put's loop (over its tokens x hidden x dim
    values) cannot take it in."""
    import fxremat

    torch.manual_seed(0)
    model, inputs = TokenExperts(), (torch.randn(512, 64),)
    backend = fxremat.backend(caller_bytes=0)  # the loss, ``.sum()`` in eager, holds nothing between the graphs
    measured = _measured_step_peak(model, inputs, backend)
    report = backend.reports[0]
    gathered = 512 * 128 * 64 * 4  # 16 MiB
    if tp.BMM_OUTER_PRODUCT_IS_POINTWISE:
        assert measured < gathered / 8  # the premise: Inductor never materialises the gathered weights (0.88 MiB)
    else:  # the weight gradient's outer product is an extern bmm before torch 2.12: its output exists whole
        assert measured > gathered
    # 28% low without that buffer (659,968 vs 918,024); > 16 MiB before the bmm/scatter rule
    assert abs(report.simulated_peak_bytes - measured) <= 0.02 * measured, (report.simulated_peak_bytes, measured)


def _inductor_split(model, inputs):
    """fxremat's (forward, backward, num_fwd_outputs) of one step, on the joint graph Inductor would partition (its
    decompositions), with no-op compilers: what ``simulate_step`` is given under ``torch.compile``."""
    from functorch.compile import make_boxed_func

    import fxremat
    from fxremat.options import Options
    from fxremat_passes import _torch_private as tp

    reports, split = [], {}
    partition_fn = fxremat.make_partition_fn(Options.create(), reports)

    def capture(gm, joint_inputs, **kwargs):
        split["fw"], split["bw"] = partition_fn(gm, joint_inputs, **kwargs)
        split["n"] = kwargs["num_fwd_outputs"]
        return split["fw"], split["bw"]

    backend = tp.aot_autograd_as_inductor(capture, lambda gm, _: make_boxed_func(gm.forward))
    torch.compile(model, backend=backend)(*inputs).sum().backward()
    return split["fw"], split["bw"], split["n"]


def _simulated_units(graph_module) -> set[str]:
    from fxremat_passes.simulator.liveness import _Phase

    return {u.name for u in _Phase(graph_module.graph, keep=set(), carried={}).units}


def test_inductors_random_draw_is_stored_where_a_reduction_reads_it():
    """Inductor's lowering realizes its random draw (``lowering.inductor_random``: ``result.realize()``).  Fused into
    dropout's multiply in forward, the draw is kernel-local and never allocated; in backward the weight gradient's
    ``sum`` reads the redrawn mask from another loop nest, so its buffer exists.  The graphs are example("dropout")'s
    split as Inductor partitions it (its joint-graph pass replays the draw from a saved seed): 65,808 B measured under
    real Inductor, 33,032 simulated when the draw was inlined into the sum, 65,800 now."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_random)
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import simulate_step

    prims, rows, cols = torch.ops.prims, 128, 64

    def forward(x, w, seeds):
        seed = prims.inductor_lookup_seed(seeds, 0)
        keep = prims.inductor_random([rows, cols], seed, "rand") > 0.5
        return x * w * keep * 2.0, x, seed

    def backward(x, seed, tangent):
        keep = prims.inductor_random([rows, cols], seed, "rand") > 0.5
        return (tangent * keep * 2.0 * x).sum(0)

    x, seeds = torch.randn(rows, cols), torch.randint(0, 2**31, (1,))
    fw = make_fx(forward)(x, torch.randn(cols), seeds)
    bw = make_fx(backward)(x, prims.inductor_lookup_seed(seeds, 0), torch.randn(rows, cols))
    timeline = simulate_step(fw, bw, 1).timeline
    activation = rows * cols * 4
    assert max(b for phase, _, b in timeline if phase == "forward") < 2 * activation  # the forward's draw fused away
    assert ("backward", "inductor_random") in {(phase, unit) for phase, unit, _ in timeline}
    assert max(b for phase, _, b in timeline if phase == "backward") >= 2 * activation  # the gradient and the mask


def test_zeros_a_returned_scatter_starts_from_are_never_allocated():
    """A weight gradient built by index_put into zeros is returned; Inductor fills the gradient's own buffer with
    the zeros inside the scatter's kernel, so the zeros never exist alone (Mixtral: one zeros tensor of each expert
    weight's size was held through both layers' backward, 23.15 MiB simulated then, 20.40 without them)."""
    from fxremat_passes.simulator.liveness import simulate_step

    torch.manual_seed(0)
    fw, bw, num_fwd_outputs = _inductor_split(TokenExperts(), (torch.randn(64, 64),))
    returned = {a.name for a in next(n for n in bw.graph.nodes if n.op == "output").all_input_nodes}
    scatters = [n for n in bw.graph.nodes if n.target is torch.ops.aten.index_put.default]
    zeros = {n.args[0].name for n in scatters if n.args[0].target is torch.ops.aten.full.default}
    assert zeros and {n.name for n in scatters} <= returned  # the premise: returned scatters into zeros
    assert not zeros & _simulated_units(bw)
    simulated = {node for phase, node, _ in simulate_step(fw, bw, num_fwd_outputs).timeline if phase == "backward"}
    assert not zeros & simulated


class AddToProduct(nn.Module):
    """relu(x @ w + y): Inductor's post-grad pass rewrites the add into one addmm, whose output the relu reads; with
    ``share`` the product is read twice and stays an mm and an add."""

    def __init__(self, share: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 48))
        self.share = share

    def forward(self, x, y):
        product = torch.mm(x, self.w)
        out = (product + y).relu()
        return out + product.sin() if self.share else out


def test_an_add_of_a_matmul_is_one_addmm_whose_product_never_exists_alone():
    from fxremat_passes.simulator.backends import backend_rules
    from fxremat_passes.simulator.lowering import addmm_matmul

    cpp = backend_rules("cpp")
    for share in (False, True):
        torch.manual_seed(0)
        fw, _, _ = _inductor_split(AddToProduct(share), (torch.randn(16, 32), torch.randn(16, 48)))
        (mm,) = [n for n in fw.graph.nodes if n.target is torch.ops.aten.mm.default]
        add = next(u for u in mm.users if u.target is torch.ops.aten.add.Tensor)
        units = _simulated_units(fw)
        if share:
            assert addmm_matmul(add, backend=cpp) is None and mm.name in units
        else:
            assert addmm_matmul(add, backend=cpp) is mm
            # the addmm writes the sum, which the relu reads rather than computing it in its own loop
            assert mm.name not in units and add.name in units


def test_of_two_products_summed_inductor_folds_the_second_into_the_addmm():
    """A weight read twice has its two gradient products summed: ``add(mm_a, mm_b)``.  Inductor's post-grad pattern
    ``add(inp, mm)`` is registered first, so ``mm_b`` is folded (``addmm(mm_a, ...)``) and ``mm_a`` runs where it
    stands, its inputs freed there; folding ``mm_a`` instead held a block's gradient buffers until the second
    traversal's backward (issue #22's model B, simulated 40.6 MiB where Inductor measured 23.6)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.backends import backend_rules
    from fxremat_passes.simulator.lowering import addmm_matmul

    def two_products(a, b, c, d):
        return torch.mm(a, b) + torch.mm(c, d)

    graph = make_fx(two_products)(*(torch.randn(8, 8) for _ in range(4))).graph
    first, second = [n for n in graph.nodes if n.target is torch.ops.aten.mm.default]
    (add,) = [n for n in graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert add.args == (first, second) and addmm_matmul(add, backend=backend_rules("cpp")) is second


class EmbedNorm(nn.Module):
    """An embedding lookup and an RMS norm: its backward scatters the rows' gradients into the table's."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1024, 16)

    def forward(self, idx):
        x = self.emb(idx)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_an_embedding_gradient_scatters_inside_the_kernel_that_computes_the_rows_gradients():
    """Inductor loops a scatter over the values it scatters, not over its output (the table), and a load of some
    rows of a table over those rows: so the embedding gradient's scatter runs inside the norm backward's kernel
    (T5's kernel ``..._embedding_dense_backward_..._pow_rsqrt_sum_23``), not after it as a kernel of its own."""
    from fxremat_passes.simulator.liveness import _Phase

    torch.manual_seed(0)
    _, bw, _ = _inductor_split(EmbedNorm(), (torch.randint(0, 1024, (4, 16)),))
    phase = _Phase(bw.graph, keep=set(), carried={})
    (scatter,) = [n for n in bw.graph.nodes if n.target is tp.EMBEDDING_GRAD_SCATTER]
    (kernel,) = [units for units in phase.kernels.values() if scatter in units]
    assert any(u.target is torch.ops.aten.sum.dim_IntList for u in kernel), [u.name for u in kernel]


class TwoReaders(nn.Module):
    def forward(self, x):
        s, a = torch.sigmoid(x), x + 1
        return (s * 2 + s.sin()).sum(-1) + (a * 3 + a.cos()).sum(-1)


def test_a_costly_value_read_twice_is_stored_once():
    """On CPU Inductor stores a value read by two nodes when computing it calls exp, log, sigmoid or tanh
    (``should_realize_on_reuse``) instead of recomputing it in each reader; a cheap one (an add) is recomputed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import _Phase

    gm = make_fx(TwoReaders(), tracing_mode="fake")(torch.randn(8, 16))
    phase = _Phase(gm.graph, keep=set(), carried={})
    (sigmoid,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.sigmoid.default]
    (add,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor and len(n.users) == 2]
    assert phase.unit[sigmoid] is sigmoid
    assert phase.unit[add] is None


# --- hand-counted backward graphs: forward saves 16x8 fp32 values (512 B each; two unless a test says otherwise),
# backward gets them and the tangent of a scalar loss (4 B, never read: gone at once).


def _simulated_backward(backward, saved: int = 2):
    """simulate_step on a forward that saves ``saved`` 512 B values and ``backward`` traced with fake tensors; the
    backward placeholders are named like AOTAutograd's (the tangent last)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import simulate_step

    def forward(x):
        return (x.sum(), *(x.sin() + k for k in range(saved)))

    x = torch.randn(16, 8)
    fw = make_fx(forward, tracing_mode="fake")(x)
    bw = make_fx(backward, tracing_mode="fake")(*(torch.randn(16, 8) for _ in range(saved)), torch.tensor(1.0))
    return _backward_peak(simulate_step(fw, bw, 1))


def _backward_peak(estimate) -> int:
    """The most bytes held while a backward kernel runs (the saved values included)."""
    return max(nbytes for phase, _, nbytes in estimate.timeline if phase == "backward")


def test_no_inplace_over_an_input_two_units_of_one_kernel_read():
    """a*b and a+b fuse into one kernel; Inductor counts each reader of a and b per scheduler node and marks them
    done after the whole kernel (Scheduler.decide_inplace_update), so neither output is written over a or b: the
    backward holds a, b and both outputs (4 x 512 B).  The simulator used to let the second writer take a (1536 B),
    which on a recomputed SwiGLU backward (gate, up and the incoming gradient read by three units of one kernel)
    left three buffers out per layer."""

    def backward(a, b, tangents_1):
        return a * b, a + b

    assert _simulated_backward(backward) == 4 * 512


def test_inplace_over_an_input_its_kernel_reads_again_only_upstream():
    """RMSNorm-like: r = sum(a*a) and y = a*r fuse into one kernel; the reduction that also reads a runs before y
    (an ancestor), so Inductor writes y over a; b*2 is written over b.  Nothing new is held (1024 B); without the
    ancestor exception y would be a new buffer (1536 B)."""

    def backward(a, b, tangents_1):
        r = (a * a).sum(-1, keepdim=True)
        return a * r, b * 2

    assert _simulated_backward(backward) == 2 * 512


def test_inplace_takes_the_first_read_its_loop_loads():
    """A SiLU backward, ``b * s * (1 + a * (1 - s))`` with ``s = sigmoid(a)`` stored (read twice, costly on CPU:
    StorageBox.should_realize_on_reuse), and ``b * 2`` beside it: both fuse into one kernel.  Inductor's
    decide_inplace_update takes the first qualifying read in the order the loop loads them (b, s, a): b has two
    readers, s only this one, so the result is written over s, which is then a buffer of its own, and a is not
    written over.  The backward holds a, b and both outputs (4 x 512 B).  By graph order the simulator wrote the
    result over a (1536 B): on a recomputed SwiGLU backward that left one tokens x 4H buffer out (issue #15's
    sliding-window Mistral, memory_budget=0.2: simulated 9.4% below the profiler's peak)."""

    def backward(a, b, tangents_1):
        s = torch.sigmoid(a)
        return b * s * (1 + a * (1 - s)), b * 2

    assert _simulated_backward(backward) == 4 * 512


def test_no_inplace_over_a_tangent():
    """AOTAutograd donates backward's saved tensors to Inductor, not its tangents (Inductor's can_reuse refuses
    undonated graph inputs): a kernel never writes over a tangent, even one it reads last.  Forward saves nothing
    here; backward holds the tangent and the gradient (2 x 512 B), as a saved input would have been written over."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import simulate_step

    x = torch.randn(16, 8)
    fw = make_fx(lambda x: (x.sin(),), tracing_mode="fake")(x)
    bw = make_fx(lambda tangents_1: (tangents_1 * 2,), tracing_mode="fake")(x.clone())
    assert _backward_peak(simulate_step(fw, bw, 1)) == 2 * 512


def test_cpu_realizes_a_heavy_pointwise_value_read_twice():
    """s = sigmoid(a*b) read by two kernels (2*s, and 3*s broadcast to 2x16x8: another loop size) with a matmul
    between them (m = o1^T o1, 8x8, 256 B), so the first kernel's C++ call is flushed and its dead inputs freed
    before the second (``Walk.grouped``).  Inductor on CPU realizes a reused value whose computation holds a heavy
    op (StorageBox.should_realize_on_reuse): s is written over a in the first kernel, b dies there, and s is held
    for the second (s + o1 + m + 1024 B = 2304 B).  A value without one is recomputed in each reader, so a and b
    live to the second kernel (a + b + o1 + m + 1024 B)."""

    def heavy(a, b, tangents_1):
        s = (a * b).sigmoid()
        o1 = s * 2 + 1
        m = o1.t() @ o1
        return o1, s.expand(2, 16, 8) * 3 + m[0, 0]

    def light(a, b, tangents_1):
        s = (a * b) * 5
        o1 = s * 2 + 1
        m = o1.t() @ o1
        return o1, s.expand(2, 16, 8) * 3 + m[0, 0]

    assert _simulated_backward(heavy) == 2 * 512 + 256 + 1024
    assert _simulated_backward(light) == 3 * 512 + 256 + 1024


def test_cpu_frees_a_run_of_generated_kernels_inputs_after_the_run():
    """Two generated kernels in a row are one C++ call on CPU (``Scheduler.codegen`` flushes the ``KernelGroup``
    only before an extern kernel): b, read last by the first kernel (s = a*b*2, written over a), is freed only after
    the second (3*s broadcast to 2x16x8, another loop size): s + b + 1024 B.  With a matmul between them the group is
    flushed first and b is gone: s + m + 1024 B (m = s^T s, 256 B)."""

    def grouped(a, b, tangents_1):
        s = a * b * 2
        return s, s.expand(2, 16, 8) * 3

    def flushed(a, b, tangents_1):
        s = a * b * 2
        m = s.t() @ s
        return s, s.expand(2, 16, 8) * 3 + m[0, 0]

    assert _simulated_backward(grouped) == 2 * 512 + 1024
    assert _simulated_backward(flushed) == 512 + 256 + 1024


def test_a_value_reading_more_than_four_buffers_is_realized_when_reused():
    """s = a+b+c+d+e reads five buffers, more than Inductor inlines into several readers (realize_reads_threshold):
    realized (over a) in the first kernel, where b..e die with it, held for the second.  A matmul between the two
    kernels (m = o1^T o1, 256 B) flushes the first kernel's C++ call, so b..e are freed before the second (see
    ``Walk.grouped``).  Peak: s, b..e and o1 in the first kernel (6 x 512 B; the second holds s, o1, m and 1024 B);
    recomputed in each reader, a..e would live to the second kernel (6 x 512 + 256 + 1024 B).  In a recomputed
    transformer stack the residual stream (the embedding plus every block's output) is such a value: Inductor
    computes it for every block in one early kernel and holds it."""

    def backward(a, b, c, d, e, tangents_1):
        s = a + b + c + d + e
        o1 = s * 2 + 1
        m = o1.t() @ o1
        return o1, s.expand(2, 16, 8) * 3 + m[0, 0]

    assert _simulated_backward(backward, saved=5) == 6 * 512


def test_slice_scatter_is_a_pointwise_select():
    """Inductor lowers slice_scatter to a masked load of its two inputs (lowering.slice_scatter), inlined into each
    reader like a pointwise op: read by two kernels (different loop sizes) it is recomputed in both and never held
    (a + the two outputs, 512 + 1024 + 2048 B), where a kernel of its own would hold it (+1024 B)."""

    def backward(a, tangents_1):
        y = torch.ops.aten.slice_scatter(torch.zeros(16, 16), a, 1, 0, 8)
        return y * 3 + 1, y.expand(2, 16, 16) * 2 + 1

    assert _simulated_backward(backward, saved=1) == 512 + 1024 + 2048


def test_a_cpu_cat_is_a_fresh_buffer_never_written_over_its_kernels_input():
    """On CPU Inductor lowers every cat to a ConcatKernel (lowering.cat), a NopKernel whose buffer is allocated on
    its own and filled by the kernels computing its inputs: never an in-place update, even of an input the same
    size that its kernel reads last.  Forward saves s (16x16 fp32, 1024 B); backward's cat of two halves of 2*s
    and 3*s holds s and a new 1024 B buffer (2048 B), where an in-place write over s would hold 1024 B.  A
    recomputed SwiGLU's backward writes gate's and up's gradients so (Llama stack, memory_budget=0.0: -11.7%)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import simulate_step

    x = torch.randn(16, 16)
    fw = make_fx(lambda x: (x.sum(), x.sin() + 1), tracing_mode="fake")(x)

    def backward(s, tangents_1):
        return (torch.cat([s[:, :8] * 2, s[:, 8:] * 3], 1),)

    def pointwise(s, tangents_1):
        return (s * 2,)

    for bw, held in ((backward, 2048), (pointwise, 1024)):
        gm = make_fx(bw, tracing_mode="fake")(x.clone(), torch.tensor(1.0))
        assert _backward_peak(simulate_step(fw, gm, 1)) == held, bw.__name__


def test_of_fusions_sharing_as_many_bytes_the_closest_pair_goes_first():
    """a = p*2 feeds a matmul whose product b = p*h reads, so a and b cannot share a kernel; x = p+1 could join
    either (all three read p, 512 B).  Inductor ranks fusions by shared bytes, then by proximity (score_fusion):
    x joins b, its neighbour, not a, the earliest.  On a recompute plan of the Llama stack the earliest-first rule
    fused a block's recomputed input norm with a recomputed norm twenty kernels earlier, which pulled the block's
    recomputation there (peak_budget=0.0: simulated +19.7%, after -0.6%)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import _Phase

    def f(p, w):
        a = p * 2
        b = p * torch.mm(a, w)
        return b, p + 1

    gm = make_fx(f, tracing_mode="fake")(torch.randn(16, 8), torch.randn(8, 8))
    phase = _Phase(gm.graph, keep=set(), carried={})
    kernels = sorted(sorted(u.name for u in units) for units in phase.kernels.values())
    assert kernels == [["add", "mul_1"], ["mm"], ["mul"]], kernels


def test_column_reductions_fuse_with_each_other_not_with_row_loops():
    """A norm backward: a row sum (reducing the innermost dimension) and the pointwise gradient over the rows, and
    two column sums (weight gradients: summed over the rows, the innermost dimension kept).  All read g and x over
    16x8 elements, but a column sum reads them at other indices than a row loop does, so Inductor's fusion score
    finds "no shared data" between them (score_fusion_memory; seen in TORCH_LOGS=fusion for this very function):
    the column sums share one kernel, the row sum and the gradient another."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import _Phase

    def f(g, x):
        r = (g * x).sum(-1, keepdim=True)
        return g * r, (g * x).sum(0), (g + x).sum(0)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(16, 8), torch.randn(16, 8))
    phase = _Phase(gm.graph, keep=set(), carried={})
    kernels = sorted(sorted(u.name for u in units) for units in phase.kernels.values())
    assert kernels == [["mul_1", "sum_1"], ["sum_2", "sum_3"]], kernels


def test_fusion_prefers_reads_at_the_same_index():
    """RoPE over two layers, reduced: two forwards read the cos and sin tables at their own index, a backward
    between them reads cos there too but sin through a transpose (RoPE's backward reads sin at c3 + 32 and c3 - 32),
    and the second forward reads the backward through a matmul, so either pair may fuse but not all three.  Inductor
    scores a fusion by the bytes two nodes read at one index (``score_fusion_memory``), and those outrank proximity:
    the two forwards share one kernel, run after the matmul (the real output code of this very function:
    ``cpp_fused_add_mul_transpose_0`` computes the backward, then the mm, then ``cpp_fused_add_mul_view_1`` both
    forwards).  Scored by shared storage bytes alone, the three pairs tie and the first forward fused with the
    nearer backward: on LlamaStack at memory_budget=0.2 that kept layer 0's recomputed norm, projections and RoPE
    out of layer 1's backward, 1.05 MB below the real peak."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import _Phase

    def f(x0, g, w, cos, sin):
        fwd0 = x0 * cos + x0 * sin
        bwd = g * cos + (g * sin).transpose(-1, -2)
        x1 = torch.mm(bwd.reshape(128, 8), w).reshape(16, 8, 8)
        return fwd0, bwd, x1 * cos + x1 * sin

    args = (torch.randn(16, 8, 8), torch.randn(16, 8, 8), torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8))
    gm = make_fx(f, tracing_mode="fake")(*args)
    phase = _Phase(gm.graph, keep=set(), carried={})
    kernels = sorted(sorted(u.name for u in units) for units in phase.kernels.values())
    assert kernels == [["add", "add_2"], ["add_1"], ["mm"]], kernels
    assert [u.name for head in phase.fusion_order() for u in phase.kernels[head]] == ["add_1", "mm", "add", "add_2"]


def test_buffer_reuse_pool_holds_a_freed_buffer_within_inductors_estimate():
    """Inductor's wrapper pools a freed buffer and hands it to the next allocation of the same size and dtype when
    the estimated memory in between plus the buffer stays within the graph's estimated peak (should_reuse_buffer),
    holding it meanwhile; the most recently freed goes first, and each reuse raises the estimate it holds over."""
    from fxremat_passes.simulator.buffer_pool import _pool_held

    estimate = [10, 4, 4, 10]  # per kernel; the peak is 10
    key = (3, torch.float32)
    # freed after kernel 0, allocated at kernel 3: 3 + 4 <= 10, held during kernels 1 and 2
    assert _pool_held(estimate, [[], [], [], [(3, key)]], [[key], [], [], []]) == [0, 3, 3, 0]
    # a 7 B buffer would make 11 > 10: freed at once
    big = (7, torch.float32)
    assert _pool_held(estimate, [[], [], [], [(7, big)]], [[big], [], [], []]) == [0, 0, 0, 0]
    # another dtype is another pool
    assert _pool_held(estimate, [[], [], [], [(3, (3, torch.int32))]], [[key], [], [], []]) == [0, 0, 0, 0]
    # two freed (after kernels 0 and 1), two allocated at kernel 3: the later one first (held during 2), then the
    # earlier one over 1..2, where the estimate is now 4 and 7: 3 + 7 <= 10
    assert _pool_held(estimate, [[], [], [], [(3, key), (3, key)]], [[key], [key], [], []]) == [0, 3, 6, 0]
    # three, two of them freed after kernel 1: those two are held during kernel 2 (4 + 3 + 3 = 10); the one from
    # kernel 0 would then make 10 + 3 > 10 there, and is freed at once
    three = [[], [], [], [(3, key)] * 3]
    assert _pool_held(estimate, three, [[key], [key, key], [], []]) == [0, 0, 6, 0]


class SwiGLUStack(nn.Module):
    """Llama's MLP blocks (gate and up projections, SiLU, down projection, residual), on 3-D activations as a
    transformers model has them."""

    def __init__(self, layers: int = 3, dim: int = 64, inner: int = 256):
        super().__init__()
        self.gate = nn.ModuleList(nn.Linear(dim, inner, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(dim, inner, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(inner, dim, bias=False) for _ in range(layers))

    def forward(self, x):
        for gate, up, down in zip(self.gate, self.up, self.down):
            x = x + down(nn.functional.silu(gate(x)) * up(x))
        return x


@pytest.mark.inductor
def test_recompute_heavy_swiglu_plans_match_the_measured_peak_under_inductor():
    """Issue #8's Llama stack was 17-26% low on recompute-heavy plans.  Backward recomputes gate and up: their
    SwiGLU backward reads them and the incoming gradient in three units of one kernel, so it writes nothing in
    place; the recomputed SiLU, read by two kernels, is a buffer of its own; and Inductor's buffer reuse holds
    each block's freed buffers for the next.  Measured on this model: 3866632 B (saving nothing) and 2162696 B
    (peak_budget 0.0), where the simulator said 3080192 B (-20%) and 1769472 B (-18%) before."""
    import fxremat

    for options in (dict(memory_budget=0.0), dict(peak_budget=0.0)):
        torch.manual_seed(0)
        model, inputs = SwiGLUStack(), (torch.randn(2, 128, 64),)
        backend = fxremat.backend(compare_default=False, **options)
        measured = _measured_step_peak(model, inputs, backend)
        report = backend.reports[0]
        assert report.recomputed, options
        assert abs(report.simulated_peak_bytes - measured) <= 0.02 * measured, (options, report.simulated_peak_bytes)


@pytest.mark.inductor
def test_llama_stack_budget_plan_matches_the_measured_peak_under_inductor():
    """Issue #15: on the Llama-style stack (RMSNorm, RoPE, grouped-query attention, SwiGLU) the budget plans were
    up to 15% low (memory_budget=0.2: the norms' weight-gradient sums fused with the wrong neighbours) and 12% low
    (memory_budget=0.0: the SwiGLU backward's cat written in place).  Within 10% of the profiler's peak now."""
    import fxremat

    for options in (dict(memory_budget=0.2), dict(memory_budget=0.0)):
        torch.manual_seed(0)
        model, inputs = example("llama_stack", batch=1, seq=64, dim=96)
        backend = fxremat.backend(compare_default=False, **options)
        measured = _measured_step_peak(model, inputs, backend)
        simulated = backend.reports[0].simulated_peak_bytes
        assert abs(simulated - measured) <= 0.10 * measured, (options, simulated, measured)


def test_gather_read_by_a_bmm_and_another_reader_is_stored():
    """Mixtral's batched_mm experts: a gather of expert weights read by a one-row bmm fuses into it (Inductor lowers
    that bmm to a multiply and a sum on CPU); read by the bmm and by a second reader (the input gradient's bmm,
    through a permute), ``GraphLowering.run_node`` realize-hints it and Inductor stores it whole (hooked on
    Mixtral: ``graph.py`` run_node -> ``StorageBox.realize_hint``).  Without the rule a memory_budget plan of
    Mixtral simulated 21 MiB and measured 792 MiB."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.liveness import _Phase

    def one_reader(w, idx, x):
        return torch.bmm(x.unsqueeze(1), w[idx])

    def two_readers(w, idx, x, g):
        selected = w[idx]
        return torch.bmm(x.unsqueeze(1), selected), torch.bmm(g.unsqueeze(1), selected.permute(0, 2, 1))

    args = (torch.randn(3, 16, 4), torch.randint(0, 3, (8,)), torch.randn(8, 16), torch.randn(8, 4))
    stored = []
    for f, inputs in ((one_reader, args[:3]), (two_readers, args)):
        gm = make_fx(f, tracing_mode="fake")(*inputs)
        phase = _Phase(gm.graph, keep=set(), carried={})
        (gather,) = (n for n in gm.graph.nodes if n.target is torch.ops.aten.index.Tensor)
        stored.append(phase.unit[gather] is gather)
    assert stored == [False, True], stored


def test_cuda_values_are_counted_as_the_caching_allocator_rounds_them():
    """torch.cuda.max_memory_allocated counts 512-byte blocks (the caching allocator's round_size): a 40-byte CUDA
    value is a 512-byte block, a 1000-byte one 1024; CPU values are counted as they are."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxremat_passes.simulator.backends import backend_for_device
    from fxremat_passes.simulator.phase_graph import storage_bytes

    cuda, cpu = backend_for_device("cuda"), backend_for_device("cpu")
    assert [cuda.allocated_bytes(n) for n in (0, 40, 512, 1000)] == [0, 512, 512, 1024]
    assert cpu.allocated_bytes(40) == 40
    graph = fx.Graph()
    node = graph.placeholder("x")
    with FakeTensorMode():
        node.meta["val"] = torch.empty(10, device="cuda")
        assert storage_bytes(node, cuda) == 512
        node.meta["val"] = torch.empty(10)
        assert storage_bytes(node, cpu) == 40


def test_cuda_buffers_of_one_allocator_block_are_still_two_reuse_keys():
    """Inductor pools a freed buffer for an allocation of the same size (``buffer_reuse_key``): 1000 and 1024 bytes
    are one 1024-byte block to the CUDA allocator but two keys to Inductor, so the simulator keys the pool by the
    tensor's own size while it counts the block."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat_passes.simulator.phase import _Phase

    with FakeTensorMode():
        a, b = torch.empty(250, device="cuda"), torch.empty(256, device="cuda")
    gm = make_fx(lambda a, b: (a * 2, b * 2), tracing_mode="fake")(a, b)
    phase = _Phase(gm.graph, keep=set(), carried={})
    small, large = (n for n in gm.graph.nodes if n.op == "call_function")
    assert phase.facts.nbytes(small) == phase.facts.nbytes(large) == 1024
    assert phase._reuse_key(small, small) != phase._reuse_key(large, large)


def test_each_node_runs_at_the_points_of_the_kernels_that_run_it():
    """``simulate_step(points=True)``: every graph node's (first, last) points on the timeline (``StepPoints``,
    ``walk.node_points``).  A point's own node (a unit) runs at it; the units of one kernel share its span; a node
    no kernel stores (a view, an input, a value fused away into its readers) runs where the kernels reading it do,
    the first to the last; without ``points`` the estimate is the same and carries none."""
    import helpers

    from fxremat_passes.simulator.liveness import simulate_step

    model, inputs = example("block_sdpa")
    partition_fn, _, graphs = helpers.recording_partition_fn()
    helpers.run_aot(model, inputs, partition_fn)
    fw, bw = graphs[:2]
    plain, estimate = simulate_step(fw, bw, 1), simulate_step(fw, bw, 1, points=True)
    assert plain.points is None and plain == estimate and plain.timeline == estimate.timeline
    points = {"forward": estimate.points.forward, "backward": estimate.points.backward}
    for p, (phase, name, _) in enumerate(estimate.timeline):
        if phase in points:
            first, last = points[phase][name]
            assert first <= p <= last, (phase, name)
    inferred = 0
    for phase, gm in (("forward", fw), ("backward", bw)):
        units = {name for p, name, _ in estimate.timeline if p == phase}
        for node in gm.graph.nodes:
            spans = [points[phase][u.name] for u in node.users if u.name in points[phase]]  # not a dead view
            if node.name in units or not spans:
                continue
            inferred += node.op == "call_function"
            # an item of a multi-output op runs in its op's kernel; any other node where its readers do
            if node.name in points[phase] and node.target is not operator.getitem:
                assert points[phase][node.name] == (min(s[0] for s in spans), max(s[1] for s in spans)), node.name
    assert inferred > 0, "the example has views or fused-away values"
