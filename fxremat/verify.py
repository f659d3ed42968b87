"""``verify=True``: check a compiled graph against eager on its first call, for users who doubt a plan.

On the first call of each graph Dynamo compiled, before the real call, the same step runs twice more, from copies of
its inputs taken first:

1. the compiled graph on the real inputs, a fixed random-weighted sum of its outputs differentiated by
   ``torch.autograd.grad`` (never ``.backward()``: nothing accumulates into ``.grad``); the inputs it updated in
   place (BatchNorm's running statistics) are put back from the copies, so the real call updates them once;
2. the reference: Dynamo's FX graph run eagerly through autograd on the copies (its in-place updates land there),
   the same weighted sum differentiated w.r.t. the copies.

Forward outputs, gradients w.r.t. every input that requires grad, and the inputs either run updated in place are
compared; anything off by more than ``tolerance`` of the reference's largest magnitude raises
``FxrematVerifyError``, naming the graph and the first value that differs.  The torch RNG state is restored before
each run and before the real call, so the user's step draws what it would have drawn without ``verify``.

Graphs that draw random numbers (dropout) are skipped, with one ``FxrematVerifyWarning`` per backend: Inductor draws
from its own random streams (seeded from torch's generator), never equal to eager's, so no comparison is possible.
They are found by their use of torch's generators (the CPU and CUDA states before and after each run).

The wrapper goes around the callable Inductor returns, so a warm compile-cache hit (the partitioner never called)
is verified too.  It costs a copy of the graph's inputs and one compiled and one eager forward+backward, on the
first call only.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx

# Relative to the reference's largest magnitude, in float32 and float64; Inductor reorders fp32 reductions (1.5e-4
# measured on the convnet's BatchNorm gradients, tests/e2e), a wrong plan is off by O(1).
TOLERANCE = 1e-3
# Half-precision graphs: a few rounding steps of the lowest precision in the graph (bfloat16: 6.3e-2).
LOW_PRECISION_ULPS = 8
# The seed of the weights that turn the outputs into one scalar to differentiate (the same for both runs).
WEIGHT_SEED = 20


class FxrematVerifyError(RuntimeError):
    """``verify=True`` found a compiled graph whose outputs or gradients differ from eager's."""


class FxrematVerifyWarning(UserWarning):
    """``verify=True`` could not check a graph (random ops, or its eager reference failed)."""


@dataclass
class _Input:
    """One tensor the graph reads, and a copy of it taken before the step: the reference's input, and what the
    compiled step's in-place updates are undone from."""

    name: str
    position: int  # its index in the graph's arguments
    original: torch.Tensor
    leaf: torch.Tensor  # detached copy, requires_grad as the original's: the reference's gradients are w.r.t. it
    arg: torch.Tensor  # what the reference reads: the leaf, or (where the original is not a leaf) a clone of it


@dataclass
class _Step:
    outputs: list  # tensors, or None where an output is not a tensor
    weights: list = field(default_factory=list)  # the compiled run's: both runs differentiate the same sum
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    mutated: dict[str, torch.Tensor] = field(default_factory=dict)  # inputs updated in place: values afterwards
    drew_random: bool = False


def _twin(name: str, position: int, tensor: torch.Tensor) -> _Input:
    leaf = tensor.detach().clone(memory_format=torch.preserve_format).requires_grad_(tensor.requires_grad)
    # a non-leaf input may be updated in place by the step; the reference's leaf could not be
    arg = leaf if tensor.is_leaf or not tensor.requires_grad else leaf.clone()
    return _Input(name, position, tensor, leaf, arg)


def _flat(out) -> list:
    values = list(out) if isinstance(out, (list, tuple)) else [out]
    return [v if isinstance(v, torch.Tensor) else None for v in values]


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _same_rng_state(a, b) -> bool:
    if not torch.equal(a[0], b[0]):
        return False
    # CUDA came up in between: nothing to compare with (_rng_state never reads it before it is up: that would
    # start it, seconds and GPU memory on a CPU model)
    if a[1] is None or b[1] is None:
        return True
    return all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


def _weights(outputs: Sequence) -> list[torch.Tensor | None]:
    """Fixed-seed random weights for the outputs gradients flow from (None elsewhere): a plain sum could hide
    gradient errors that cancel."""
    generator = torch.Generator().manual_seed(WEIGHT_SEED)
    weights = []
    for out in outputs:
        if out is None or not out.requires_grad or not out.is_floating_point():
            weights.append(None)
            continue
        w = torch.randn(out.shape, generator=generator, dtype=torch.float32)
        weights.append(w.to(device=out.device, dtype=out.dtype))
    return weights


def _grads(outputs: Sequence, weights: Sequence, wrt: list[tuple[str, torch.Tensor]]) -> dict:
    terms = [
        (out * w).sum().float()
        for out, w in zip(outputs, weights, strict=False)
        if w is not None and out is not None and out.requires_grad
    ]
    if not terms or not wrt:
        return {name: None for name, _ in wrt}
    grads = torch.autograd.grad(sum(terms), [t for _, t in wrt], allow_unused=True)
    return {name: g for (name, _), g in zip(wrt, grads, strict=True)}


def _inputs(reference: fx.GraphModule, args: Sequence) -> list[_Input]:
    """The graph's tensor inputs, by placeholder name: parameters and buffers among them (torch 2.13 always lifts a
    module's state to inputs of Dynamo's graphs; ``inline_inbuilt_nn_modules`` is gone)."""
    names = [n.name for n in reference.graph.find_nodes(op="placeholder")]
    return [
        _twin(names[i] if i < len(names) else f"input {i}", i, a)
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor)
    ]


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()) or a.shape != b.shape:
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())  # NaNs in place: still the same


def _changed(inputs: list[_Input], now: Callable[[_Input], torch.Tensor], before: Callable[[_Input], torch.Tensor]):
    """The inputs whose values differ: found by value, since eager BatchNorm updates its running statistics
    without bumping their version counters."""
    return [i for i in inputs if not _same_values(now(i), before(i))]


def _compiled_step(run: Callable[[list], object], args: Sequence, inputs: list[_Input]) -> _Step:
    """The compiled step on the real inputs, differentiated by ``torch.autograd.grad``; the inputs it updated in
    place are then put back from their copies (the real call that follows updates them once)."""
    before = _rng_state()
    changed: list[_Input] = []
    try:
        outputs = _flat(run(list(args)))
        step = _Step(outputs, _weights(outputs))
        step.grads = _grads(outputs, step.weights, [(i.name, i.original) for i in inputs if i.original.requires_grad])
        # Inductor draws its random seeds from torch's generator: a changed state means random ops
        step.drew_random = not _same_rng_state(before, _rng_state())
        changed = _changed(inputs, lambda i: i.original, lambda i: i.arg)
        step.mutated = {i.name: i.original.detach().clone() for i in changed}
    finally:
        with torch.no_grad():
            for i in changed:
                i.original.copy_(i.arg)
    return step


def _reference_step(reference: fx.GraphModule, args: Sequence, inputs: list[_Input], weights: list) -> _Step:
    """The step run eagerly on the inputs' copies (after the compiled step: the originals hold the values from
    before the step again): outputs, gradients of the same weighted sum, and the copies it updated in place."""
    ref_args = list(args)
    for i in inputs:
        ref_args[i.position] = i.arg
    before = _rng_state()
    outputs = _flat(reference(*ref_args))
    step = _Step(outputs, weights, drew_random=not _same_rng_state(before, _rng_state()))
    step.grads = _grads(outputs, weights, [(i.name, i.leaf) for i in inputs if i.leaf.requires_grad])
    step.mutated = {i.name: i.arg.detach() for i in _changed(inputs, lambda i: i.arg, lambda i: i.original)}
    return step


def _as_real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (torch.view_as_real(t) if t.is_complex() else t).to(torch.float64)


def relative_error(actual: torch.Tensor | None, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (finite entries), with NaNs and infinities equal where both have
    them; a missing gradient counts as zeros.  Scaled to the reference's magnitude, so near-zero tensors are not
    flagged for rounding."""
    if actual is None:
        actual = torch.zeros_like(expected)
    if actual.shape != expected.shape:
        return math.inf
    if expected.layout != torch.strided or actual.layout != torch.strided:
        return 0.0  # sparse or nested: not compared
    a, e = _as_real(actual), _as_real(expected)
    same = (a == e) | (a.isnan() & e.isnan())
    diff = torch.where(same, 0.0, (a - e).abs()).nan_to_num(nan=math.inf)
    finite = e.abs()[e.isfinite()]
    scale = finite.max().item() if finite.numel() else 0.0
    worst = diff.max().item() if diff.numel() else 0.0
    return worst / scale if scale > 0 else worst


def tolerance(reference: fx.GraphModule, outputs: Sequence) -> float:
    """TOLERANCE, or LOW_PRECISION_ULPS rounding steps of the lowest floating precision the graph computes in
    (its values' dtypes, as Dynamo recorded them: autocast regions included)."""
    dtypes = {o.dtype for o in outputs if o is not None}
    for node in reference.graph.nodes:
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            dtypes.add(value.dtype)
    eps = max((torch.finfo(d).eps for d in dtypes if d.is_floating_point), default=0.0)
    return max(TOLERANCE, LOW_PRECISION_ULPS * eps)


def _output_names(reference: fx.GraphModule) -> list[str]:
    values = reference.graph.output_node().args[0]
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return [f"output {i} ({v.name})" if isinstance(v, fx.Node) else f"output {i}" for i, v in enumerate(values)]


def _differences(ours: _Step, ref: _Step, output_names: list[str], tol: float) -> list[tuple[str, str]]:
    """(what, how) for each value that differs beyond ``tol``, in order: outputs, gradients (by input), inputs
    updated in place."""
    count = len(ref.outputs)
    names = output_names + [f"output {i}" for i in range(len(output_names), count)]
    pairs = list(zip(names, ours.outputs + [None] * (count - len(ours.outputs)), ref.outputs))
    pairs += [(f"the gradient w.r.t. {name}", ours.grads.get(name), g) for name, g in ref.grads.items()]
    pairs += [(f"{name} after its in-place update", ours.mutated.get(name), m) for name, m in ref.mutated.items()]
    found = []
    for what, actual, expected in pairs:
        if expected is None:
            if actual is not None and actual.numel() and actual.abs().max().item() > 0:
                found.append((what, "is nonzero where eager's is None"))
            continue
        if actual is not None and actual.shape != expected.shape:
            found.append((what, f"has shape {tuple(actual.shape)} where eager's has {tuple(expected.shape)}"))
            continue
        error = relative_error(actual, expected)
        if not error <= tol:
            found.append((what, f"differs from eager's: max |compiled - eager| / max |eager| = {error:.3g}"))
    return found


def _message(graph_name: str, found: list[tuple[str, str]], tol: float) -> str:
    (what, how), others = found[0], [w for w, _ in found[1:]]
    more = f"; {len(others)} more differ: {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
    return (
        f"fxremat verify: {graph_name} computes wrong values: {what} {how} (tolerance {tol:g}){more if others else ''}."
        " The compiled step does not match the same graph run eagerly, so its plan is wrong for this graph. Compile"
        " this model with backend='inductor' (PyTorch's own partitioner) to train correctly meanwhile, and report"
        " this message with the graph's fxremat report (fxremat.format_text(backend.reports[i]))."
    )


class Verifier:
    """One per backend: wraps the compiled graphs, and warns once about the graphs it cannot check."""

    def __init__(self) -> None:
        self._warned_random = False

    def wrap(self, compiled: Callable, reference: fx.GraphModule, graph_name: str) -> Callable:
        """``compiled``, checked against ``reference`` (a copy of the graph it was compiled from, taken before
        Inductor's passes rewrote it) on its first call.  Dynamo calls what a backend returns as ``f(*args)``
        whatever its ``_boxed_call`` says (AOTAutograd's unboxed wrapper copies that flag from the boxed function
        inside it), and so does this."""
        pending = [True]

        def run(args: list):
            return compiled(*args)

        @functools.wraps(compiled)
        def call(*args):
            if pending:
                pending.clear()  # once, even when the check raises
                self.check(run, reference, args, graph_name)
            return compiled(*args)

        return call

    def check(self, run: Callable[[list], object], reference: fx.GraphModule, args: Sequence, graph_name: str):
        """Raise FxrematVerifyError where ``run(args)`` differs from ``reference(*args)``; leave the inputs and
        the RNG state as they were."""
        inputs = _inputs(reference, args)  # copies taken before anything runs: the reference's, and the snapshot
        rng = _rng_state()
        ref = None
        try:
            ours = _compiled_step(run, args, inputs)
            if not ours.drew_random:
                _set_rng_state(rng)
                ref = self._reference(reference, args, inputs, ours.weights, graph_name)
        finally:
            _set_rng_state(rng)
        if ours.drew_random or (ref is not None and ref.drew_random):
            self._warn_random(graph_name)
            return
        if ref is None:
            return
        tol = tolerance(reference, ref.outputs)
        # an input one run updated and the other did not: the other's value is the one from before the step
        for name in ours.mutated.keys() - ref.mutated.keys():
            ref.mutated[name] = next(i.arg for i in inputs if i.name == name)
        for name in ref.mutated.keys() - ours.mutated.keys():
            ours.mutated[name] = next(i.original for i in inputs if i.name == name)
        found = _differences(ours, ref, _output_names(reference), tol)
        if found:
            raise FxrematVerifyError(_message(graph_name, found, tol))

    @staticmethod
    def _reference(reference, args, inputs, weights, graph_name: str) -> _Step | None:
        try:
            return _reference_step(reference, args, inputs, weights)
        except Exception as error:  # our reference, not the user's step: say so and let the step run
            warnings.warn(
                f"fxremat verify: {graph_name} is not verified: running it eagerly failed "
                f"({type(error).__name__}: {error})",
                FxrematVerifyWarning,
                stacklevel=4,
            )
            return None

    def _warn_random(self, graph_name: str) -> None:
        if self._warned_random:
            return
        self._warned_random = True
        warnings.warn(
            f"fxremat verify: {graph_name} draws random numbers (dropout, torch.rand, ...) and is not verified: "
            "Inductor draws from its own random streams, never equal to eager's, so the two cannot be compared. "
            "To check its plan, verify a run with dropout off (p=0). (Shown once; later such graphs are skipped "
            "silently.)",
            FxrematVerifyWarning,
            stacklevel=4,
        )
