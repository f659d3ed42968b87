"""simulate_step: the memory a training step holds over time, for a (forward, backward) split, without running it.

What it models (all in one place, so the rule can be checked against measurements:
benchmarks/investigations/peak_memory.py, and ``run.py``'s simulated peak beside the measured one):
* Peak means bytes allocated during the step above what was live at its start (parameters, buffers and inputs
  are not counted; gradients are, since they are allocated during backward and outlive it).
* Each graph runs as Inductor schedules it.  Every materialised buffer (below) is one unit of work; units of
  Inductor's own kernels (pointwise, copies, reductions, norms) fuse when they share a read or one reads the other,
  their loops have the same size and fusing makes no cycle (largest shared bytes first, then the closest pair:
  ``score_fusion``); a column reduction (a norm's weight gradient) fuses only with column reductions of its shape,
  since it reads its input at other indices than a row loop (``lowering.column_reduction``); the fused kernel runs
  at its earliest member's place, dependencies first (``Scheduler.fuse_nodes`` then ``topological_sort_schedule``).
  Matmuls, convolutions, attention and custom ops run alone.  Fusion moves work: e.g. a recomputed GELU and its
  backward fuse through their shared read of the saved input, so the saved input dies before the weight gradient's
  matmul that sat between them in graph order.
* A unit allocates its output's storage when it runs; a storage is freed after the last kernel that reads it or any
  alias of it.  Views (and items of view tuples) allocate nothing; a buffer read only inside its own fused kernel
  never leaves it.  A kernel unit writes in place over an input of the same size that no other unit reads, its
  own kernel's included unless they feed it (Inductor's in-place update), including backward's saved inputs, which
  backward frees as they die, never its tangents (not donated).
* On CPU a ``cat`` is a ConcatKernel: a buffer of its own, stored whatever reads it, that its inputs' kernels write
  into, never an in-place update of an input nor written over by a reader (``lowering.concat_kernel``); Inductor's
  own estimate counts its bytes twice until its kernel group is done (``walk.Walk.count_slices``).  A scatter's
  result is written over the tensor it scatters into, never over its values (``phase._Phase._scattered_into``).
  The op-level facts live in ``lowering.py``.
* Inductor's buffer reuse (``buffer_pool.py``): a freed buffer is held until a later allocation of the same size
  and dtype takes it, as long as Inductor's own estimate of the graph's memory stays within its estimated peak
  (``_pool_held``).
* What forward returns stays alive: saved values until their last use in backward, other outputs until forward
  ends (the caller drops them: ``model(x).sum().backward()`` keeps only the loss).  Backward's outputs (gradients)
  stay alive to the end.  Tangents are allocated when backward starts.  Between the two, where the graph returns
  no loss, the caller's eager loss holds its own buffers on top of the forward's end (``boundary.py``): one point
  of the timeline, ``boundary``.
* Fusion away: a pointwise/copy/creation value whose every reader is one Inductor fuses it into (pointwise, copy,
  reduction, norm, view) never leaves its kernel, so it allocates nothing (``materialises``), whether or not those
  readers are returned; unless Inductor realizes it: read several times and costly (CPU), or reading many buffers
  (``_realized_on_reuse``).
* A loop's size: what a kernel writes or reads, except that a scatter loops over the values it scatters and a
  gather over the rows it picks (``scatter_values``).  An ``add`` of an ``mm`` is one addmm (``addmm_matmul``).
* Inductor's layout optimisation (``layout.py``): in a forward with 2-D convolutions, the channels-last copies of
  graph inputs read by a convolution are allocated when forward starts and, when saved, held until their last use
  in backward, unless fxremat compiles the split: it saves such an input as itself (``layout.saved_inputs_as_views``),
  so forward frees the copy after its last reader there and backward makes its own before its first reader
  (``recopied_saved_inputs``; ``recopy=False`` simulates stock Inductor's compile of PyTorch's split); mkldnn's
  ``convolution_backward`` holds two extra weight-sized buffers while it returns the weight gradient
  (``workspace_bytes``: counted while the op runs, gone after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.fx as fx

from ..graph.costs import alias_root
from . import boundary
from .backends.kernel_runs import joined_orders, runs_of, too_large
from .inputs import SimulatorInputs, inputs_for
from .layout import channels_last_copies, layout_optimised, recopied_saved_inputs
from .node_facts import NodeFacts
from .phase import _Phase, phase_root
from .phase_graph import PhaseGraph, graph_view, storage_bytes
from .walk import node_points


@dataclass(frozen=True)
class StepPoints:
    """Where each graph node runs on a step's timeline (``walk.node_points``), per phase: node name -> (first, last)
    point (indices into ``PeakEstimate.timeline``) of the kernels that run it.  A use of a storage is a kernel
    reading it: its last forward use and first backward use are read from its readers' points (DESIGN §16)."""

    forward: dict[str, tuple[int, int]]
    backward: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class PeakEstimate:
    peak_bytes: int  # the most bytes the step holds above its start
    peak_phase: str  # "forward" or "backward"
    peak_node: str  # the node running when the peak is reached
    forward_peak_bytes: int
    backward_peak_bytes: int
    gradient_bytes: int  # what backward returns (gradients), all of them
    activation_peak_bytes: int  # the most bytes held at once that are not gradients
    caller_bytes: int  # of the step's bytes, those the caller's own work holds between the graphs (``boundary.py``)
    timeline: tuple[tuple[str, str, int], ...]  # (phase, node, most bytes held while it runs)
    # each node's points on the timeline, only where asked for (``simulate_step(points=True)``), else None
    points: StepPoints | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_timeline(cls, timeline: list[tuple[str, str, int]], **figures: int) -> PeakEstimate:
        """The estimate whose peak is the timeline's first highest point; ``figures``: the phase peaks, the
        gradient and activation bytes."""
        peak_phase, peak_node, peak = "forward", "", 0
        for phase, node, total in timeline:
            if total > peak:
                peak_phase, peak_node, peak = phase, node, total
        return cls(peak_bytes=peak, peak_phase=peak_phase, peak_node=peak_node, timeline=tuple(timeline), **figures)


# The timeline's point between the graphs, where the caller computes its loss from the outputs (``boundary.py``).
CALLER_LOSS = "caller's loss on the outputs"
# Graph inputs Inductor's memory estimate never counts, by name (``is_nonfreeable_buffers``): parameters, tangents.
# It counts every other input of backward as freed after its last reader, saved views of parameters (a transposed
# weight) included, at the view's size, although their storage outlives the graph.
NONFREEABLE_INPUTS = ("primals_", "arg", "fwd_rng_state", "bwd_rng_state", "tangents")


def saved_views_of_inputs(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> frozenset[str]:
    """The backward's inputs that are saved views of forward inputs (a transposed weight): their storage outlives
    the backward, which Inductor's memory estimate cannot see (``_torch_private.mark_inputs_never_freed``).
    Forward returns saved tensors then saved SymInts; backward takes the SymInts first, then the tensors."""
    saved = list(fw.graph.output_node().args[0][num_fwd_outputs:])
    tensors = [n for n in saved if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"][len(saved) - len(tensors) :]
    return frozenset(p.name for p, value in zip(placeholders, tensors) if alias_root(value).op == "placeholder")


def simulate_step(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    num_fwd_outputs: int,
    recopy: bool = True,
    inputs: SimulatorInputs | None = None,
    points: bool = False,
) -> PeakEstimate:
    """The step's simulation (``simulate_backwards``); ``points``: with each node's points on its timeline
    (``PeakEstimate.points``), which cost a pass over both graphs, so only where asked for."""
    return next(simulate_backwards(fw, [bw], num_fwd_outputs, recopy, inputs, points))


def simulate_backwards(
    fw: fx.GraphModule, bws, num_fwd_outputs: int, recopy: bool = True, inputs=None, points: bool = False
):
    """``simulate_step(fw, bw)`` for each backward of ``bws`` (an iterable), in turn: backwards of one forward (a
    split's segmentations, ``segments.lowest_peak_segments``) share its simulation, which no backward changes.
    ``recopy``: the split is compiled by fxremat, which saves inputs instead of their channels-last copies
    (``layout_pins.saved_inputs_as_views``); False for PyTorch's split as stock Inductor compiles it.  ``inputs``:
    the ``SimulatorInputs`` (``inputs.py``), by default those the config in force implies for ``fw``."""
    inputs = inputs_for(fw, inputs)
    # Channels-last copies of graph inputs (Inductor's layout optimisation) are allocated as forward starts and
    # stand in for their placeholder from then on: freed after its last reader, or carried into backward if saved.
    fw_view, channels_last = graph_view(fw.graph), layout_optimised(fw, inputs)
    copies = channels_last_copies(fw, inputs)
    bw_views = (graph_view(bw.graph) for bw in bws)
    yield from simulate_views(fw_view, bw_views, num_fwd_outputs, channels_last, copies, inputs, recopy, points)


def simulate_views(
    fw: PhaseGraph, bws, num_fwd_outputs: int, channels_last: bool, copies, inputs, recopy=True, points=False
):
    """``simulate_backwards`` over views (``phase_graph.py``): the forward's simulated once for every backward of
    ``bws``; a plan's forward that was never built (``plan_memory.plan_views``) shares what earlier simulations of
    its joint nodes computed.  ``channels_last``, ``copies``: as ``simulate_phases`` takes them."""
    forward = None
    for bw_view in bws:
        if forward is None:  # which copies forward keeps depends on backward's readers, the same in every backward
            forward = _ForwardRun(fw, num_fwd_outputs, copies, bw_view if recopy else None, inputs)
        yield forward.step(bw_view, channels_last, points=points)


def forward_run(fw: PhaseGraph, num_fwd_outputs: int, copies: dict[str, int], inputs) -> _ForwardRun:
    """The simulation of forward ``fw`` (its ``timeline``), for steps with backwards after it (``step(bw_view,
    channels_last)``), where no saved input is recopied in backward (``copies`` empty, or PyTorch's split)."""
    return _ForwardRun(fw, num_fwd_outputs, copies, None, inputs)


def _with_facts(view: PhaseGraph, backend) -> PhaseGraph:
    """``view`` with a ``NodeFacts`` of its own where it has none (a built graph's), so that its reordered views
    (``_ForwardRun.joined``) share what the simulation computes of its nodes (their fusion is keyed by their place):
    a partition that simulates many segmented backwards of one graph computes those facts once."""
    return view if view.facts is not None else replace(view, facts=NodeFacts(backend))


def simulated_backward(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs=None) -> _Phase:
    """The simulation of ``bw`` as it is (never reordered): its kernels and their order after fusion."""
    inputs = inputs_for(fw, inputs)
    copies = channels_last_copies(fw, inputs)
    forward = _ForwardRun(graph_view(fw.graph), num_fwd_outputs, copies, graph_view(bw.graph), inputs)
    forward.step(graph_view(bw.graph), layout_optimised(fw, inputs), join=False)
    return forward.backward


def joined_step(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs=None):
    """(the simulated step of ``bw`` reordered for fewer C++ units (``_ForwardRun.joined``), its new node order),
    or None where it keeps its order."""
    if too_large(len(fw.graph.nodes), len(bw.graph.nodes)):
        return None
    inputs = inputs_for(fw, inputs)
    fw_view, channels_last = graph_view(fw.graph), layout_optimised(fw, inputs)
    copies = channels_last_copies(fw, inputs)
    bw_view = _with_facts(graph_view(bw.graph), inputs.backend)
    forward = _ForwardRun(fw_view, num_fwd_outputs, copies, bw_view, inputs)
    return forward.joined(bw_view, channels_last, forward.step(bw_view, channels_last, join=False))


def simulate_phases(
    fw: PhaseGraph,
    bw: PhaseGraph,
    num_fwd_outputs: int,
    channels_last: bool,
    copies: dict[str, int],
    inputs: SimulatorInputs,
) -> PeakEstimate:
    """``simulate_step`` over the two graphs' views (``phase_graph.py``): built, or a plan's that were never built.
    ``channels_last``: whether Inductor optimises their layout; ``copies``: the channels-last copies of forward's
    inputs (``layout.py``)."""
    return _ForwardRun(fw, num_fwd_outputs, copies, bw, inputs).step(bw, channels_last)


class _ForwardRun:
    """The forward's simulation, and the step with a backward after it (``step``, as often as asked).  ``bw``: a
    backward whose readers decide which saved inputs fxremat's compile recopies in backward (None: none)."""

    def __init__(
        self, fw: PhaseGraph, num_fwd_outputs: int, copies: dict[str, int], bw: PhaseGraph | None, inputs
    ) -> None:
        self.fw, self.timeline, self.num_fwd_outputs, self.copies = fw, [], num_fwd_outputs, copies
        self.inputs = inputs
        fw_returns = fw.returned_args  # with repeats: forward's outputs, then saved values, by position
        self.saved = fw_returns[num_fwd_outputs:]
        self.recopy = bw is not None and bool(copies)
        recopied = recopied_saved_inputs(fw, bw, num_fwd_outputs, copies)[0] if self.recopy else frozenset()
        # a recopied input's copy is not kept for backward (the input itself is the caller's)
        saved_roots = {phase_root(n, fw).name for n in self.saved if n not in recopied}
        self.user_roots = {phase_root(n, fw).name for n in fw_returns[:num_fwd_outputs]}
        self.phase = _Phase(fw, keep=saved_roots | self.user_roots, carried=copies, inputs=inputs)
        self.peak = self.phase.run("forward", self.timeline)

    def step(self, bw: PhaseGraph, channels_last: bool, join: bool | None = None, points: bool = False):
        """The step with ``bw`` after this forward; ``join``: with ``bw`` reordered where ``joined`` keeps it (by
        default, where the inputs say the backward is handed over so: ``SimulatorInputs.joins_kernel_runs``);
        ``points``: with each node's points on the timeline (``StepPoints``)."""
        if not (self.inputs.joins_kernel_runs if join is None else join):
            estimate = self._step(bw, channels_last)
        else:
            bw = _with_facts(bw, self.inputs.backend)
            estimate = self._step(bw, channels_last)
            joined = self.joined(bw, channels_last, estimate)
            estimate = estimate if joined is None else joined[0]
        if points:  # ``self.backward`` is the phase of ``estimate`` (``joined`` keeps the one it returns)
            estimate = replace(estimate, points=StepPoints(node_points(self.phase), node_points(self.backward)))
        return estimate

    def joined(self, bw: PhaseGraph, channels_last: bool, estimate: PeakEstimate):
        """(the step with ``bw`` in one of ``kernel_runs.joined_orders``, that order): of the orders better than
        ``bw``'s own (``estimate``, just simulated) by ``_better``, the lowest peak, then the fewest runs; None where
        there is none."""
        if too_large(len(self.fw.nodes), len(bw.nodes)):
            return None
        own = self.backward
        runs, best, best_key = runs_of(own), None, None
        for order in joined_orders(bw, own):
            joined = self._step(replace(bw, nodes=order), channels_last)
            key = (joined.peak_bytes, runs_of(self.backward))
            if _better(key, (estimate.peak_bytes, runs)) and (best_key is None or key < best_key):
                best, best_key, phase = (joined, order), key, self.backward
        self.backward = own if best is None else phase
        return best

    def _step(self, bw: PhaseGraph, channels_last: bool) -> PeakEstimate:
        forward, timeline = self.phase, list(self.timeline)
        outside = self._caller_bytes(bw)
        if outside:  # the caller's eager loss, on top of what the forward's end holds (``boundary.py``)
            timeline.append(("boundary", CALLER_LOSS, sum(forward.live.values()) + outside))
        arrivals = recopied_saved_inputs(self.fw, bw, self.num_fwd_outputs, self.copies)[1] if self.recopy else {}
        backward = _backward_phase(
            self.fw, bw, self.saved, forward.live, self.user_roots, channels_last, arrivals, self.inputs
        )
        backward_peak = backward.run("backward", timeline)
        self.backward = backward  # the last step's simulated backward: its kernels and their order (``joined``)
        backend = self.inputs.backend
        gradient_bytes = sum(storage_bytes(a, backend) for a in bw.returned if phase_root(a, bw) not in bw.inputs)
        return PeakEstimate.of_timeline(
            timeline,
            forward_peak_bytes=self.peak,
            backward_peak_bytes=backward_peak,
            gradient_bytes=gradient_bytes,
            activation_peak_bytes=max(forward.activation_peak, backward.activation_peak),
            caller_bytes=outside,
        )

    def _caller_bytes(self, bw: PhaseGraph) -> int:
        """The bytes of the caller's work between forward and backward (``boundary.caller_bytes``)."""
        values = [n.meta.get("val") for n in backward_tangents(bw, len(self.saved))]
        tangents = [v for v in values if isinstance(v, torch.Tensor)]
        outside = boundary.caller_bytes(self.inputs.caller_bytes, tangents)
        return self.inputs.backend.allocated_bytes(outside) if outside else 0


def _better(joined: tuple[int, int], own: tuple[int, int]) -> bool:
    """Whether an order of (simulated peak, runs of generated kernels) ``joined`` is better than the backward's own: no
    more runs and no higher peak, and fewer of one.  A unit is never bought with peak (docs/DESIGN.md §8), nor peak with
    a unit.  A lower peak at as many runs counts: the moves that join runs also run weight-gradient matmuls later, and
    where the runs stay apart (recomputation between them) the later allocation alone lowers the peak, which can let an
    unsegmented plan peak as low as a segmented one, at less recompute (docs/DESIGN.md §8)."""
    return joined[0] <= own[0] and joined[1] <= own[1] and joined != own


def backward_tangents(bw: PhaseGraph, num_saved: int) -> list[fx.Node]:
    """Backward's tangents: its inputs after the saved values (the saved SymInts, then the saved tensors)."""
    return [n for n in bw.nodes if n in bw.inputs][num_saved:]


def _backward_phase(fw, bw, saved: list, live: dict, user_roots: set, channels_last: bool, arrivals: dict, inputs):
    """Into backward: saved storages plus the tangents autograd allocates.  Forward returns saved tensors, then saved
    SymInts; backward takes the SymInts first, then the tensors (in the same order), then the tangents.
    ``arrivals``: backward inputs allocated before their first reader (``layout.recopied_saved_inputs``)."""
    saved_tensors = [n for n in saved if isinstance(n.meta.get("val"), torch.Tensor)]
    num_symbols = len(saved) - len(saved_tensors)
    bw_placeholders = [n for n in bw.nodes if n in bw.inputs]
    tensor_placeholders = bw_placeholders[num_symbols : num_symbols + len(saved_tensors)]
    carried: dict[str, int] = {}
    carried_roots: set[str] = set()
    for placeholder, value in zip(tensor_placeholders, saved_tensors):
        root_name = phase_root(value, fw).name
        if root_name in live and root_name not in carried_roots:
            carried_roots.add(root_name)  # two saved views of one storage: counted once (freed with the first)
            carried[placeholder.name] = live[root_name]
    for placeholder in backward_tangents(bw, len(saved)):
        carried[placeholder.name] = storage_bytes(placeholder, inputs.backend)
    gradients = {phase_root(a, bw).name for a in bw.returned}
    fw_inputs = set(fw.inputs)
    return _Phase(
        bw,
        inputs=inputs,
        keep=gradients,
        carried=carried,
        gradients=frozenset(gradients),
        channels_last=channels_last,
        estimated_inputs={
            p.name: storage_bytes(p, inputs.backend)
            for p in tensor_placeholders
            if not p.name.startswith(NONFREEABLE_INPUTS)
        },
        # AOTAutograd donates backward's saved tensors (``bw_donated_idxs``) but not those a forward output aliases
        donated=frozenset(
            p.name for p, v in zip(tensor_placeholders, saved_tensors) if phase_root(v, fw).name not in user_roots
        ),
        never_freed=frozenset(
            p.name for p, v in zip(tensor_placeholders, saved_tensors) if phase_root(v, fw) in fw_inputs
        ),
        arrivals=arrivals,
    )


def simulated_kernels(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs=None) -> dict:
    """The step's kernels as the simulator schedules them, per phase ("forward", "backward") in their order: each
    kernel as the names of the values it stores (its units), then of every node it computes (``members``): what a
    recorded Inductor schedule is compared with (``fxremat/replay.py``).  ``bw`` is simulated as it is (never
    reordered: a compiled split's backward is in its final order)."""
    inputs = inputs_for(fw, inputs)
    copies = channels_last_copies(fw, inputs)
    forward = _ForwardRun(graph_view(fw.graph), num_fwd_outputs, copies, graph_view(bw.graph), inputs)
    forward.step(graph_view(bw.graph), layout_optimised(fw, inputs), join=False)

    def kernels(phase: _Phase) -> list[dict]:
        return [
            dict(
                units=[u.name for u in phase.kernels[head]],
                members=[m.name for u in phase.kernels[head] for m in phase.members[u]],
            )
            for head in phase.fusion_order()
        ]

    return {"forward": kernels(forward.phase), "backward": kernels(forward.backward)}
