"""Backward checkpoints (passes/rewrite/segments.py): the segmented backward computes the same gradients, has a first pass
that recomputes the checkpoints, never copies a random op, and holds less at once than the lazy recomputation of
the whole forward."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import assert_grads_close, capture_joint, eager_grads, run_fxremat_aot

from fxremat.examples import MLP, Block, Stack, example
from fxremat.options import Options
from fxremat.partition import PartitionRequest, partition
from fxremat_passes.graph.costs import PROFILES, node_cost
from fxremat_passes.graph.ops import NEVER_RECOMPUTE, OpClass, op_class
from fxremat_passes.rewrite.segments import segment_backward
from fxremat_passes.rewrite.split import FIRST_PASS_SUFFIX
from fxremat_passes.simulator.liveness import simulate_step
from fxremat_passes.simulator.phase_graph import graph_view
from fxremat_passes.solver.shortlists import plan_key


def _mlp_stack():
    return torch.nn.Sequential(*[MLP(16, 64) for _ in range(4)]), (torch.randn(32, 16),)


MODELS = {
    "stack6": lambda: (Stack(6, dim=32, heads=2), (torch.randn(2, 16, 32),)),
    "llama_stack": lambda: example("llama_stack", batch=2, seq=16, dim=32),
    "mlp_stack4": _mlp_stack,
}


def _partition(model, inputs, **options):
    """(forward, backward, report) of fxremat's partition of the model's joint graph (no Inductor)."""
    joint, kwargs = capture_joint(model, inputs)
    request = PartitionRequest(copy.deepcopy(joint), None, kwargs["num_fwd_outputs"], None, "test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fw, bw, report = partition(request, Options.create(compare_default=False, strict=True, **options))
    return fw, bw, report, kwargs["num_fwd_outputs"]


def _recipe(model, inputs, **options):
    """The recipe of fxremat's split (before segmenting) for these options."""
    import fxremat_passes.choice.segmented as segmented

    recipes = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segmented, "lowest_peak_segments", lambda r, *a, **k: (recipes.append(r), (r, None))[1])
        patch.setattr(segmented, "segment_recompute_flops", lambda *a: 0)
        _partition(model, inputs, backward_segments=True, **options)
    (recipe,) = recipes
    return recipe


def _first_pass(bw) -> list:
    return [n for n in bw.graph.nodes if n.op == "call_function" and n.name.endswith(FIRST_PASS_SUFFIX)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_segmented_gradients_equal_eager(name):
    model, inputs = MODELS[name]()
    _, expected = eager_grads(model, inputs)
    _, grads, saved, reports = run_fxremat_aot(
        model, inputs, strict=True, compare_default=False, memory_budget=0.0, backward_segments=True
    )
    assert_grads_close(grads, expected)
    assert reports[0].segment_recompute_flops > 0
    assert saved.nbytes == 0  # the transform changes backward only: forward still saves nothing


def test_backward_has_a_first_pass_with_unique_names_and_meta():
    model, inputs = MODELS["stack6"]()
    _, bw, _, _ = _partition(model, inputs, memory_budget=0.0, backward_segments=True)
    first = _first_pass(bw)
    assert len(first) > 10
    names = [n.name for n in bw.graph.nodes]
    assert len(names) == len(set(names))
    assert all("val" in n.meta for n in first)
    # the whole first pass runs before the other recomputation (the forward's addmms): all of it needs a checkpoint
    calls = [n for n in bw.graph.nodes if n.op == "call_function"]
    matmuls = [i for i, n in enumerate(calls) if n.target is torch.ops.aten.addmm.default]
    first_set = set(first)
    assert max(calls.index(n) for n in first) < min(i for i in matmuls if calls[i] not in first_set)


def test_report_counts_a_checkpoint_recomputed_only_in_the_first_pass():
    """A checkpoint the main pass reads from the first pass has no copy under its own name: the report still lists
    its recomputation (Mixtral's expert ``bmm`` under ``memory_budget=0.2`` was missing from ``recomputed`` and from
    ``est_recompute_seconds``), and a node recomputed in both passes is listed once."""
    model, inputs = MODELS["stack6"]()
    fw, bw, report, _ = _partition(model, inputs, memory_budget=0.0, backward_segments=True)
    forward = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    main = {n.name for n in bw.graph.nodes if n.op == "call_function" and n not in set(_first_pass(bw))}
    only_first = {n.name for n in _first_pass(bw)} - {m + FIRST_PASS_SUFFIX for m in main}
    assert only_first, "stack6 at 0.0 reads some checkpoint from the first pass alone"
    listed = [r.name for r in report.recomputed]
    assert only_first <= set(listed)
    assert not ({n.name for n in _first_pass(bw)} - only_first) & set(listed)
    originals = [name.removesuffix(FIRST_PASS_SUFFIX) for name in listed]
    assert len(originals) == len(set(originals)) and set(originals) <= forward
    # the plan's recomputation and what its segments add are all the backward computes of the forward again (the
    # missing first-pass-only recomputes made this short by their FLOPs)
    again = [n for n in bw.graph.nodes if n.op == "call_function" and n.name.removesuffix(FIRST_PASS_SUFFIX) in forward]
    total = sum(node_cost(n, PROFILES["cpu"]).flops for n in again)
    assert report.segment_recompute_flops > 0
    assert report.recompute_flops + report.segment_recompute_flops == total


def test_segments_lower_the_simulated_peak_of_a_6_block_stack():
    model, inputs = MODELS["stack6"]()
    plain = simulate_step(*_partition(model, inputs, memory_budget=0.0, backward_segments=False)[:2], 1)
    plain = plain.activation_peak_bytes
    fw, bw, report, num_fwd_outputs = _partition(model, inputs, memory_budget=0.0, backward_segments=True)
    segmented = simulate_step(fw, bw, num_fwd_outputs).activation_peak_bytes
    assert segmented < 0.5 * plain, (segmented, plain)
    assert report.simulated_activation_peak_bytes == segmented  # the report simulates the same (rebuilt) split


def test_random_ops_are_never_copied():
    torch.manual_seed(0)
    model, inputs = torch.nn.Sequential(*[Block(32, 2, dropout=0.1) for _ in range(4)]), (torch.randn(2, 16, 32),)
    recipe = _recipe(model, inputs, memory_budget=0.0)
    _, plain_bw = recipe.build()
    _, bw = segment_backward(recipe).build()
    assert _first_pass(bw), "the dropout stack still has segments to cut"
    # marked, for the simulator and fxremat's compiles alike (``fusion.HORIZONTAL_DRAG_FACTOR``)
    assert graph_view(bw.graph).segmented and not graph_view(plain_bw.graph).segmented
    assert not [n for n in _first_pass(bw) if op_class(n) in NEVER_RECOMPUTE]

    def random_nodes(gm):
        return sorted(n.name for n in gm.graph.nodes if n.op == "call_function" and op_class(n) is OpClass.RANDOM)

    assert random_nodes(bw) == random_nodes(plain_bw)


@pytest.mark.inductor
def test_inductor_segmented_step_peak_is_lower(tmp_path, monkeypatch):
    """Real Inductor: gradients equal eager, and the measured step peak is lower with segments."""
    import fxremat
    from fxremat.measure import step_peak_bytes

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    peaks = []
    for segments in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, inputs = Stack(4, dim=32, heads=2), (torch.randn(4, 128, 32),)  # activations above gradients
        _, expected = eager_grads(model, inputs)
        backend = fxremat.backend(memory_budget=0.0, backward_segments=segments, compare_default=False, strict=True)
        compiled = torch.compile(model, backend=backend)

        def step(compiled=compiled):
            compiled(*inputs).sum().backward()

        step()
        model.zero_grad(set_to_none=True)
        peaks.append(step_peak_bytes(step, "cpu")[0])
        assert_grads_close({n: p.grad for n, p in model.named_parameters()}, expected)
    assert peaks[1] < 0.8 * peaks[0], peaks


def test_lowest_peak_segments_is_no_higher_than_any_grid_entry():
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.rewrite.segments import checkpoint_grid, lowest_peak_segments, segment_recompute_seconds

    recipe = _recipe(*MODELS["stack6"](), memory_budget=0.0)
    chosen, peak = lowest_peak_segments(recipe, 1, PROFILES["cpu"])
    assert chosen.bw_checkpoints
    assert segment_recompute_seconds(recipe, chosen, PROFILES["cpu"]) > 0
    for _, sets in checkpoint_grid(recipe):  # ranked by the step peak, gradients included (session 23)
        other = simulate_step(*segment_backward(recipe, sets).build(lazy=True), 1).peak_bytes
        assert peak.peak_bytes <= 1.02 * other
    assert peak.peak_bytes < simulate_step(*recipe.build(lazy=True), 1).peak_bytes


def test_budget_zero_recomputes_in_segments_by_default():
    """memory_budget=0.0 leaves only the fewest-bytes plan, whose plain backward recomputes the whole forward at
    once: the peak-safe choice segments it (backward_segments=None, the default), and the report says so."""
    model, inputs = MODELS["stack6"]()
    plain = _partition(model, inputs, memory_budget=0.0, backward_segments=False)[2]
    auto = _partition(model, inputs, memory_budget=0.0)[2]
    assert not plain.backward_checkpoints and auto.backward_checkpoints and auto.segment_recompute_flops > 0
    assert auto.saved_bytes == plain.saved_bytes == 0
    # measured here: 0.79x the step peak (gradients included), 0.32x the activation peak; raised by 0 (was 88 KiB)
    assert auto.simulated_peak_bytes < 0.85 * plain.simulated_peak_bytes
    assert auto.simulated_activation_peak_bytes < 0.5 * plain.simulated_activation_peak_bytes
    assert auto.peak_raised_by_budget < plain.peak_raised_by_budget


def test_segmentations_simulated_after_one_forward_are_their_own_simulations():
    # ``lowest_peak_segments`` simulates the segmentations' backwards after one shared forward
    # (``liveness.simulate_backwards``): each result must be ``simulate_step`` of that segmentation's own split
    from fxremat_passes.rewrite.segments import checkpoint_grid
    from fxremat_passes.simulator.liveness import simulate_backwards

    recipe = _recipe(*MODELS["stack6"](), memory_budget=0.0)
    candidates = [recipe, *(segment_backward(recipe, sets) for _, sets in checkpoint_grid(recipe))]
    assert len(candidates) > 2
    shared = list(
        simulate_backwards(recipe.build_forward(lazy=True), (c.build_backward(lazy=True) for c in candidates), 1)
    )
    assert shared == [simulate_step(*c.build(lazy=True), 1) for c in candidates]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_segmentations_simulated_unbuilt_equal_those_simulated_built(name):
    """A budget's segmentations simulate the plan's forward and each segmented backward as views that were never
    built (``plan_memory.forward_view``, ``segment_view.py``, sharing what the plans' estimates computed): every
    simulation equals the one of the graphs built and simulated afresh, the timeline included; where none is
    simulated (the recipe's own peak is its forward's), none of them peaks lower than the recipe."""
    import fxremat_passes.rewrite.segments as segments

    calls, original = [], segments._simulated_backwards

    def recorded(recipe, candidates, num_fwd_outputs, inputs, memory, floor=None):
        found = original(recipe, candidates, num_fwd_outputs, inputs, memory, floor)
        calls.append((recipe, candidates, num_fwd_outputs, inputs, memory, floor, found))
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segments, "_simulated_backwards", recorded)
        _partition(*MODELS[name](), memory_budget=0.0)
    assert calls and all(call[4] is not None for call in calls)  # the budget's choice handed on its memory
    for recipe, candidates, num_fwd_outputs, inputs, _, floor, found in calls:
        built = original(recipe, candidates, num_fwd_outputs, inputs, None)
        assert len(built) == len(candidates) >= 1
        if found is None:
            assert floor is not None and min(p.peak_bytes for p in built) >= floor
        else:
            assert found == built


class _TokenExperts(torch.nn.Module):
    """A MoE layer applied one token at a time (transformers' batched experts): each token gathers its expert's
    weights, ``(tokens, ffn, dim)`` by shape, and a one-column ``bmm`` reads them, which Inductor lowers on CPU to a
    reduction that the gather fuses into (``lowering.inductor_class``)."""

    def __init__(self, experts: int = 4, dim: int = 16, ffn: int = 64) -> None:
        super().__init__()
        self.router = torch.nn.Linear(dim, experts)
        self.weight = torch.nn.Parameter(torch.randn(experts, ffn, dim) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = self.router(x).argmax(-1)
        hidden = torch.bmm(self.weight[expert], x.unsqueeze(-1)).squeeze(-1)
        return torch.relu(hidden).sum(-1, keepdim=True) * x * self.router(x).softmax(-1)[:, :1]


def test_a_gather_inductor_never_stores_holds_nothing_in_the_segments_region():
    from fxremat_passes.rewrite.segments import _JointReads, _region, checkpoint_grid, recomputed_region

    recipe = _recipe(_TokenExperts(), (torch.randn(64, 16),), memory_budget=0.0)
    reads = _JointReads(recipe)
    nodes = recomputed_region(recipe, reads)
    (gather,) = [n for n in nodes if n.target is torch.ops.aten.index.Tensor]
    region = _region(nodes, reads)
    assert reads.nbytes(gather) == 64 * 64 * 16 * 4  # what its shape says
    assert region.storage[nodes.index(gather)] == -1  # what Inductor holds: nothing
    # so no segmentation's estimate counts it: every estimate is below the gather's bytes
    grid = checkpoint_grid(recipe)
    assert grid and all(estimate < reads.nbytes(gather) for estimate, _ in grid)
    # and no checkpoint carries it to a later segment, where a second reader would make Inductor store it
    assert all(gather not in checkpoints for _, sets in grid for checkpoints in sets)


def test_a_segmentation_reads_the_recipe_its_plans_split_would_have():
    """A budget's segmentations read a plan's split recipe made without building the split
    (``JudgedPlans.recipe_and_simulation``): the recipe the split is built from, and the plan's own simulation."""
    from fxremat_passes.choice.judged import JudgedPlans

    calls, original = [], JudgedPlans.recipe_and_simulation

    def recorded(self, plan):
        unsplit = plan_key(plan) not in self.splits
        found = original(self, plan)
        calls.append((self, plan, unsplit, found))
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JudgedPlans, "recipe_and_simulation", recorded)
        _partition(*MODELS["stack6"](), memory_budget=0.0)
    assert any(unsplit for _, _, unsplit, _ in calls)  # else this proves nothing
    for judged, plan, _, (recipe, simulation) in calls:
        assert recipe == judged.split(plan)[2]
        assert simulation == judged.simulation(plan)


def test_a_forward_is_simulated_once_for_every_plan_and_segmentation_that_has_it():
    """A plan's segmentations step from its estimate's forward simulation (``plan_memory.forward_simulation``); the
    step they make from it is the one a fresh forward simulation makes."""
    import fxremat_passes.rewrite.segments as segments
    from fxremat_passes.simulator import plan_memory
    from fxremat_passes.simulator.liveness import forward_run

    runs, reused = [], []
    original, simulation = plan_memory.forward_run, plan_memory.forward_simulation

    def recorded(*args):
        runs.append(original(*args))
        return runs[-1]

    def segmentation_reads(memory, recipe):
        reused.append(simulation(memory, recipe))
        return reused[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_memory, "forward_run", recorded)
        patch.setattr(segments, "forward_simulation", segmentation_reads)
        _partition(*MODELS["llama_stack"](), memory_budget=0.0)
    assert runs and reused and all(any(r is run for run in runs) for r in reused)
    forwards = [(tuple(n.name for n in run.fw.nodes), tuple(n.name for n in run.fw.returned_args)) for run in runs]
    assert len(forwards) == len(set(forwards))  # each forward simulated once
    for run in runs:
        fresh = forward_run(run.fw, run.num_fwd_outputs, {}, run.inputs)
        assert fresh.timeline == run.timeline and fresh.phase.live == run.phase.live


def test_segmentations_classify_nodes_by_the_simulator_inputs_backend_not_the_graphs_device(monkeypatch):
    """A plan for another backend than the graph's device (a GPU plan made on a CPU) segments by that backend's rules:
    ``lowest_peak_segments`` hands ``inputs.backend`` to every classification of the recipe's nodes."""
    from fxremat_passes.rewrite import segments
    from fxremat_passes.simulator.backends import backend_rules
    from fxremat_passes.simulator.inputs import SimulatorInputs

    recipe = _recipe(*MODELS["stack6"](), memory_budget=0.0)
    triton = backend_rules("triton")
    seen = []
    made = segments._InductorClasses.__init__

    def spy(self, reads):
        made(self, reads)
        seen.append(reads.backend)

    monkeypatch.setattr(segments._InductorClasses, "__init__", spy)
    inputs = SimulatorInputs.default("cpu").with_changes(backend=triton)
    segments.lowest_peak_segments(recipe, 1, PROFILES["h100"], inputs=inputs)
    assert seen and all(b is triton for b in seen)
    seen.clear()
    segments.checkpoint_grid(recipe)  # no inputs: the graph's device's backend
    assert seen and all(b.name == "cpp" for b in seen)
