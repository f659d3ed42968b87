"""Random small ``nn.Module``s for fuzzing the partitioner: a hypothesis strategy over *programs*.

A ``Program`` is a list of ``Step``s applied to a growing list of tensors (the state; ``state[0]`` is the input
``x``).  Each step reads some state entries (by index) and appends its results.  The strategy tracks every entry's
shape, dtype and storage group while it draws, so each drawn program runs in eager by construction:

- shapes stay tiny (every dim <= MAX_DIM), ops are only drawn where they apply (conv2d on rank 4, ...);
- in-place ops on activations are only drawn where autograd allows them: never on the leaf input, never on a storage
  that some op saved for backward (that is the "modified by an inplace operation" error), never on the outputs
  of split/chunk (multi-output views).  ``Op.saves`` says which of an op's inputs/outputs autograd keeps.

``FuzzModel(program)`` owns the parameters and buffers the steps need (a parameter used twice, BatchNorm running
stats mutated in forward, index buffers); its ``forward`` replays the steps.  A program's ``repr`` is valid Python
(dataclasses of tuples), so a failing case can be pasted into a regression test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import strategies as st

MAX_DIM = 16
VOCAB = 10
IDS_SHAPE = (2, 5)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...] = ()  # indices into the state
    params: tuple = ()  # op-specific constants: sizes, dims, flags


@dataclass(frozen=True)
class Program:
    input_shape: tuple[int, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # state indices returned, as a tuple
    ids: bool = False  # an int64 input of IDS_SHAPE for embeddings
    aux: bool = False  # a float input without grad, mutated in forward (aux.add_(1)) and then read
    unused: bool = False  # an input that requires grad and is never read

    @property
    def has_dropout(self) -> bool:
        return any(s.op == "dropout" for s in self.steps)

    @property
    def touches_bf16(self) -> bool:
        return any(s.op == "to_bf16" for s in self.steps)


# --- the draw-time model of the state ------------------------------------------------------------------------------


@dataclass
class Value:
    shape: tuple[int, ...]
    dtype: str
    group: int  # storage group: views share their base's group
    inplace_ok: bool = True


@dataclass
class Ctx:
    values: list[Value]
    saved_groups: set[int] = field(default_factory=set)  # storages autograd keeps: no in-place on them
    frozen_groups: set[int] = field(default_factory=set)  # the leaf input, bases of split/chunk: no in-place
    next_group: int = 1
    ids: bool = False

    def add(self, shape, dtype: str, group: int | None = None, inplace_ok: bool = True) -> int:
        if group is None:
            group, self.next_group = self.next_group, self.next_group + 1
        self.values.append(Value(tuple(shape), dtype, group, inplace_ok))
        return len(self.values) - 1

    def save(self, index: int) -> None:
        self.saved_groups.add(self.values[index].group)


def _pick(draw, ctx: Ctx, pred=lambda v: True) -> int | None:
    """A state index satisfying ``pred``, most recent first (hypothesis shrinks towards the first choice)."""
    candidates = [i for i in reversed(range(len(ctx.values))) if pred(ctx.values[i])]
    if not candidates:
        return None
    return draw(st.sampled_from(candidates))


# --- ops: draw (strategy side), build (parameters), run (forward) --------------------------------------------------


class Op:
    """One menu item.  ``draw`` returns a Step (and updates ctx) or None when it does not apply to the state."""

    def draw(self, draw, ctx: Ctx) -> Step | None:
        raise NotImplementedError

    def build(self, step: Step) -> nn.Module | None:
        return None

    def run(self, layer, step: Step, state: list, ids) -> list[torch.Tensor]:
        raise NotImplementedError


def _cast(p: torch.Tensor | None, like: torch.Tensor):
    """Parameters live in fp32; a bf16 activation meets a bf16 copy of them (what autocast does)."""
    return None if p is None else p.to(like.dtype)


class Linear(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        out, bias = draw(st.sampled_from([4, 8, 16])), draw(st.booleans())
        ctx.save(i)
        ctx.add(v.shape[:-1] + (out,), v.dtype)
        return Step("linear", (i,), (v.shape[-1], out, bias))

    def build(self, step):
        return nn.Linear(*step.params)

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        return [F.linear(t, _cast(layer.weight, t), _cast(layer.bias, t))]


class LinearTwice(Op):
    """One parameter used twice: tanh(x @ W) @ W."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        ctx.save(i)
        ctx.add(v.shape, v.dtype)
        return Step("linear_twice", (i,), (v.shape[-1],))

    def build(self, step):
        (d,) = step.params
        layer = nn.Module()
        layer.weight = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        return layer

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        w = _cast(layer.weight, t)
        return [torch.tanh(t @ w) @ w]


class MatmulSelf(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: len(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        ctx.save(i)
        ctx.add(v.shape[:-1] + (v.shape[-2],), v.dtype)
        return Step("matmul_self", (i,))

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        return [(t @ t.transpose(-1, -2)) * t.shape[-1] ** -0.5]


class Conv(Op):
    def __init__(self, rank: int):
        self.rank = rank  # 3: conv1d on (B, C, L); 4: conv2d on (B, C, H, W)

    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: len(v.shape) == self.rank)
        if i is None:
            return None
        v = ctx.values[i]
        out, k, bias = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 3])), draw(st.booleans())
        ctx.save(i)
        ctx.add((v.shape[0], out) + v.shape[2:], v.dtype)
        return Step(f"conv{self.rank - 2}d", (i,), (v.shape[1], out, k, bias))

    def build(self, step):
        cin, cout, k, bias = step.params
        cls = nn.Conv1d if self.rank == 3 else nn.Conv2d
        return cls(cin, cout, k, padding=k // 2, bias=bias)

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        fn = F.conv1d if self.rank == 3 else F.conv2d
        return [fn(t, _cast(layer.weight, t), _cast(layer.bias, t), padding=layer.padding)]


class LayerNorm(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: v.shape[-1] >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        ctx.save(i)
        ctx.add(v.shape, v.dtype)
        return Step("layer_norm", (i,), (v.shape[-1],))

    def build(self, step):
        layer = nn.LayerNorm(step.params[0])
        with torch.no_grad():  # not the identity affine map, so that its gradients carry information
            layer.weight.normal_(1.0, 0.1)
            layer.bias.normal_(0.0, 0.1)
        return layer

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        return [F.layer_norm(t, layer.normalized_shape, _cast(layer.weight, t), _cast(layer.bias, t))]


class RMSNorm(Op):
    """Spelled out (pow/mean/rsqrt, as many models write it) or through F.rms_norm."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: v.shape[-1] >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        ctx.save(i)
        ctx.add(v.shape, v.dtype)
        return Step("rms_norm", (i,), (v.shape[-1], draw(st.booleans())))

    def build(self, step):
        layer = nn.Module()
        layer.weight = nn.Parameter(1.0 + 0.1 * torch.randn(step.params[0]))
        return layer

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        d, manual = step.params
        w = _cast(layer.weight, t)
        if manual:
            return [t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w]
        return [F.rms_norm(t, (d,), w, eps=1e-6)]


class BatchNorm(Op):
    """Training-mode BatchNorm: its running stats are buffers mutated in forward.  bf16 input is cast to fp32 (the
    running stats stay fp32)."""

    def draw(self, draw, ctx):
        def ok(v):
            return 2 <= len(v.shape) <= 4 and math.prod(v.shape) // v.shape[1] >= 2  # >1 value per channel

        i = _pick(draw, ctx, ok)
        if i is None:
            return None
        v = ctx.values[i]
        ctx.save(i)
        ctx.add(v.shape, "f32")
        return Step("batch_norm", (i,), (v.shape[1], len(v.shape)))

    def build(self, step):
        channels, rank = step.params
        layer = (nn.BatchNorm2d if rank == 4 else nn.BatchNorm1d)(channels)
        with torch.no_grad():
            layer.weight.normal_(1.0, 0.1)
            layer.bias.normal_(0.0, 0.1)
        return layer

    def run(self, layer, step, state, ids):
        return [layer(state[step.args[0]].float())]


class Softmax(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        dim, log = draw(st.integers(0, len(v.shape) - 1)), draw(st.booleans())
        ctx.add(v.shape, v.dtype)
        ctx.save(len(ctx.values) - 1)  # softmax's backward reads its output
        return Step("softmax", (i,), (dim, log))

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        dim, log = step.params
        return [t.log_softmax(dim) if log else t.softmax(dim)]


ACTIVATIONS = {  # name -> (fn, backward reads the output rather than the input)
    "gelu": (F.gelu, False),
    "silu": (F.silu, False),
    "tanh": (torch.tanh, True),
    "sigmoid": (torch.sigmoid, True),
    "relu": (F.relu, True),
}


class Activation(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        name = draw(st.sampled_from(sorted(ACTIVATIONS)))
        out = ctx.add(ctx.values[i].shape, ctx.values[i].dtype)
        ctx.save(out if ACTIVATIONS[name][1] else i)
        return Step("act", (i,), (name,))

    def run(self, layer, step, state, ids):
        return [ACTIVATIONS[step.params[0]][0](state[step.args[0]])]


class Dropout(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        ctx.add(ctx.values[i].shape, ctx.values[i].dtype)  # backward reads the mask only
        return Step("dropout", (i,), (draw(st.sampled_from([0.1, 0.5])),))

    def run(self, layer, step, state, ids):
        return [F.dropout(state[step.args[0]], step.params[0], training=True)]


class Scale(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        ctx.add(ctx.values[i].shape, ctx.values[i].dtype)
        return Step("scale", (i,))

    def run(self, layer, step, state, ids):
        return [state[step.args[0]] * 0.5 + 0.25]


class Permute(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: len(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        perm = tuple(draw(st.permutations(range(len(v.shape)))))
        ctx.add(tuple(v.shape[p] for p in perm), v.dtype, v.group, v.inplace_ok)
        return Step("permute", (i,), perm)

    def run(self, layer, step, state, ids):
        return [state[step.args[0]].permute(*step.params)]


class Transpose(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: len(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        a, b = draw(st.lists(st.integers(0, len(v.shape) - 1), min_size=2, max_size=2, unique=True))
        shape = list(v.shape)
        shape[a], shape[b] = shape[b], shape[a]
        ctx.add(shape, v.dtype, v.group, v.inplace_ok)
        return Step("transpose", (i,), (a, b))

    def run(self, layer, step, state, ids):
        return [state[step.args[0]].transpose(*step.params)]


class Slice(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: max(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        dim = draw(st.sampled_from([d for d, s in enumerate(v.shape) if s >= 2]))
        start = draw(st.integers(0, v.shape[dim] - 1))
        length = draw(st.integers(1, v.shape[dim] - start))
        shape = list(v.shape)
        shape[dim] = length
        ctx.add(shape, v.dtype, v.group, v.inplace_ok)
        return Step("slice", (i,), (dim, start, length))

    def run(self, layer, step, state, ids):
        return [state[step.args[0]].narrow(*step.params)]


class Reshape(Op):
    """Merge two adjacent dims (product <= MAX_DIM) or split one into two.  ``reshape`` may copy (after a permute),
    so the result is conservatively put in its input's storage group."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: bool(self._options(v.shape)))
        if i is None:
            return None
        v = ctx.values[i]
        shape = draw(st.sampled_from(self._options(v.shape)))
        ctx.add(shape, v.dtype, v.group, v.inplace_ok)
        return Step("reshape", (i,), shape)

    @staticmethod
    def _options(shape) -> list[tuple[int, ...]]:
        out = []
        for d in range(len(shape) - 1):
            if shape[d] * shape[d + 1] <= MAX_DIM and len(shape) > 2:
                out.append(shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2 :])
        if len(shape) < 4:
            for d, s in enumerate(shape):
                for a in range(2, s):
                    if s % a == 0:
                        out.append(shape[:d] + (a, s // a) + shape[d + 1 :])
        return out

    def run(self, layer, step, state, ids):
        return [state[step.args[0]].reshape(step.params)]


INPLACE = ("mul_", "add_", "relu_", "slice_mul_")


class Inplace(Op):
    """x.mul_(2), x.add_(1), x.relu_(), x.narrow(d, 0, 1).mul_(2) on an activation: appends nothing, mutates an
    entry (and every view of its storage) in place."""

    def draw(self, draw, ctx):
        def ok(v):
            return v.inplace_ok and v.group not in ctx.saved_groups and v.group not in ctx.frozen_groups

        i = _pick(draw, ctx, ok)
        if i is None:
            return None
        v = ctx.values[i]
        kind = draw(st.sampled_from(INPLACE))
        params: tuple = (kind,)
        if kind == "relu_":
            ctx.save(i)  # relu_'s backward reads its (in-place) output
        if kind == "slice_mul_":
            params = (kind, draw(st.integers(0, len(v.shape) - 1)))
        return Step("inplace", (i,), params)

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        kind = step.params[0]
        if kind == "mul_":
            t.mul_(2.0)
        elif kind == "add_":
            t.add_(1.0)
        elif kind == "relu_":
            t.relu_()
        else:
            t.narrow(step.params[1], 0, 1).mul_(2.0)
        return []


class Cat(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        dim = draw(st.integers(0, len(v.shape) - 1))

        def fits(w):
            if w.dtype != v.dtype or len(w.shape) != len(v.shape) or v.shape[dim] + w.shape[dim] > MAX_DIM:
                return False
            return all(a == b for d, (a, b) in enumerate(zip(v.shape, w.shape)) if d != dim)

        j = _pick(draw, ctx, fits)
        if j is None:
            return None
        shape = list(v.shape)
        shape[dim] += ctx.values[j].shape[dim]
        ctx.add(shape, v.dtype)
        return Step("cat", (i, j), (dim,))

    def run(self, layer, step, state, ids):
        return [torch.cat([state[a] for a in step.args], dim=step.params[0])]


class Split(Op):
    """split(size, dim) or chunk(n, dim): several views; their storage is frozen against in-place ops (autograd
    forbids modifying the outputs of a multi-view op, or their base while they are in use)."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: max(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        dim = draw(st.sampled_from([d for d, s in enumerate(v.shape) if s >= 2]))
        size = v.shape[dim]
        chunk = draw(st.booleans())
        n = draw(st.integers(2, min(3, size)))
        # chunk(n) makes ceil(size / ceil(size / n)) pieces; split(size // n) makes ceil(size / (size // n))
        piece = -(-size // n) if chunk else size // n
        ctx.frozen_groups.add(v.group)
        for start in range(0, size, piece):
            shape = list(v.shape)
            shape[dim] = min(piece, size - start)
            ctx.add(shape, v.dtype, v.group, inplace_ok=False)
        return Step("split", (i,), (dim, n, chunk))

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        dim, n, chunk = step.params
        return list(t.chunk(n, dim) if chunk else t.split(t.shape[dim] // n, dim))


class IndexSelect(Op):
    """index_select, or advanced indexing t[idx] on dim 0: indices (with repeats) from a buffer."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        dim = draw(st.integers(0, len(v.shape) - 1))
        idx = tuple(draw(st.lists(st.integers(0, v.shape[dim] - 1), min_size=1, max_size=6)))
        advanced = dim == 0 and draw(st.booleans())
        shape = list(v.shape)
        shape[dim] = len(idx)
        ctx.add(shape, v.dtype)
        return Step("index", (i,), (dim, idx, advanced))

    def build(self, step):
        layer = nn.Module()
        layer.register_buffer("idx", torch.tensor(step.params[1], dtype=torch.long))
        return layer

    def run(self, layer, step, state, ids):
        t = state[step.args[0]]
        dim, _, advanced = step.params
        return [t[layer.idx] if advanced else t.index_select(dim, layer.idx)]


class Gather(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]
        dim, k, seed = draw(st.integers(0, len(v.shape) - 1)), draw(st.integers(1, 4)), draw(st.integers(0, 99))
        shape = list(v.shape)
        shape[dim] = k
        ctx.save(i)  # gather's backward (gather_backward) keeps its input, not only the index
        ctx.add(shape, v.dtype)
        return Step("gather", (i,), (dim, tuple(shape), v.shape[dim], seed))

    def build(self, step):
        _, shape, high, seed = step.params
        layer = nn.Module()
        generator = torch.Generator().manual_seed(seed)
        layer.register_buffer("idx", torch.randint(0, high, shape, generator=generator))
        return layer

    def run(self, layer, step, state, ids):
        return [torch.gather(state[step.args[0]], step.params[0], layer.idx)]


class Embedding(Op):
    """A source: reads the int64 ``ids`` input (added to the program when first drawn)."""

    def draw(self, draw, ctx):
        dim = draw(st.sampled_from([4, 8]))
        ctx.ids = True
        ctx.add(IDS_SHAPE + (dim,), "f32")
        return Step("embedding", (), (VOCAB, dim))

    def build(self, step):
        return nn.Embedding(*step.params)

    def run(self, layer, step, state, ids):
        return [layer(ids)]


class Reduce(Op):
    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: len(v.shape) >= 2)
        if i is None:
            return None
        v = ctx.values[i]
        kind, dim, keep = (
            draw(st.sampled_from(["sum", "mean", "amax"])),
            draw(st.integers(0, len(v.shape) - 1)),
            draw(st.booleans()),
        )
        shape = list(v.shape)
        if keep:
            shape[dim] = 1
        else:
            del shape[dim]
        out = ctx.add(shape, v.dtype)
        if kind == "amax":  # amax's backward reads its input and its output
            ctx.save(i)
            ctx.save(out)
        return Step("reduce", (i,), (kind, dim, keep))

    def run(self, layer, step, state, ids):
        kind, dim, keep = step.params
        return [getattr(torch, kind)(state[step.args[0]], dim, keepdim=keep)]


class Cast(Op):
    def __init__(self, to: str):
        self.to = to

    def draw(self, draw, ctx):
        i = _pick(draw, ctx, lambda v: v.dtype != self.to)
        if i is None:
            return None
        ctx.add(ctx.values[i].shape, self.to)
        return Step(f"to_{self.to}", (i,))

    def run(self, layer, step, state, ids):
        return [state[step.args[0]].to(DTYPES[self.to])]


class Binary(Op):
    """a + b or a * b, b of a's dtype and rank, broadcastable to a's shape (a residual, a gate, x - amax)."""

    def draw(self, draw, ctx):
        i = _pick(draw, ctx)
        if i is None:
            return None
        v = ctx.values[i]

        def fits(w):
            return (
                w.dtype == v.dtype
                and len(w.shape) == len(v.shape)
                and all(b in (a, 1) for a, b in zip(v.shape, w.shape))
            )

        j = _pick(draw, ctx, fits)
        if j is None:
            return None
        kind = draw(st.sampled_from(["add", "mul"]))
        if kind == "mul":
            ctx.save(i)
            ctx.save(j)
        ctx.add(v.shape, v.dtype)
        return Step("binary", (i, j), (kind,))

    def run(self, layer, step, state, ids):
        a, b = (state[k] for k in step.args)
        return [a + b if step.params[0] == "add" else a * b]


OPS: dict[str, Op] = {
    "linear": Linear(),
    "linear_twice": LinearTwice(),
    "matmul_self": MatmulSelf(),
    "conv1d": Conv(3),
    "conv2d": Conv(4),
    "layer_norm": LayerNorm(),
    "rms_norm": RMSNorm(),
    "batch_norm": BatchNorm(),
    "softmax": Softmax(),
    "act": Activation(),
    "dropout": Dropout(),
    "scale": Scale(),
    "permute": Permute(),
    "transpose": Transpose(),
    "slice": Slice(),
    "reshape": Reshape(),
    "inplace": Inplace(),
    "cat": Cat(),
    "split": Split(),
    "index": IndexSelect(),
    "gather": Gather(),
    "embedding": Embedding(),
    "reduce": Reduce(),
    "to_bf16": Cast("bf16"),
    "to_f32": Cast("f32"),
    "binary": Binary(),
}


@st.composite
def programs(
    draw, max_steps: int = 8, ops: tuple[str, ...] | None = None, dropout: bool = True, aux: bool | None = None
) -> Program:
    """A random program of 1..max_steps steps over the menu (``ops`` restricts it; ``dropout=False`` leaves
    dropout out; ``aux`` forces the mutated input in or out)."""
    menu = [name for name in (ops or OPS) if dropout or name != "dropout"]
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.integers(2, 6)) for _ in range(rank))
    ctx = Ctx(values=[Value(shape, "f32", group=0)], frozen_groups={0})  # the input is a leaf: no in-place
    if aux is None:
        aux = draw(st.booleans())
    if aux:  # forward reads x * aux (aux mutated first): state[0] is then an activation, not the leaf
        ctx.values[0] = Value(shape, "f32", group=ctx.next_group)
        ctx.next_group += 1
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        name = draw(st.sampled_from(menu))
        step = OPS[name].draw(draw, ctx)
        if step is not None:
            steps.append(step)
    last = len(ctx.values) - 1
    extra = draw(st.lists(st.integers(0, last), max_size=2, unique=True))
    outputs = (last, *[e for e in extra if e != last])
    return Program(shape, tuple(steps), outputs, ids=ctx.ids, aux=aux, unused=draw(st.booleans()))


# --- the module ----------------------------------------------------------------------------------------------------


class FuzzModel(nn.Module):
    def __init__(self, program: Program) -> None:
        super().__init__()
        self.program = program
        self.layers = nn.ModuleDict()
        for index, step in enumerate(program.steps):
            layer = OPS[step.op].build(step)
            if layer is not None:
                self.layers[f"s{index}"] = layer

    def forward(self, *inputs):
        program = self.program
        x, rest = inputs[0], list(inputs[1:])
        ids = rest.pop(0) if program.ids else None
        if program.aux:
            aux = rest.pop(0)
            aux.add_(1.0)  # a mutated graph input (no grad); the mutation must be visible to the caller
            x = x * aux
        state = [x]
        for index, step in enumerate(program.steps):
            layer = self.layers[f"s{index}"] if f"s{index}" in self.layers else None
            state.extend(OPS[step.op].run(layer, step, state, ids))
        return tuple(state[k] for k in program.outputs)


def make_inputs(program: Program, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """x (requires grad), then ids, aux (no grad) and unused (requires grad, never read) when the program has them."""
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(program.input_shape, generator=generator).requires_grad_()]
    if program.ids:
        inputs.append(torch.randint(0, VOCAB, IDS_SHAPE, generator=generator))
    if program.aux:
        inputs.append(torch.randn(program.input_shape, generator=generator))
    if program.unused:
        inputs.append(torch.randn(3, generator=generator).requires_grad_())
    return tuple(inputs)


def fresh(inputs) -> tuple[torch.Tensor, ...]:
    """Copies for one run: inputs get mutated (aux) and accumulate .grad."""
    return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)


def loss_of(outputs) -> torch.Tensor:
    """A fixed random projection of every output (a plain sum would give softmax outputs a zero gradient)."""
    total = 0.0
    for k, out in enumerate(outputs):
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1000 + k))
        total = total + (out.float() * weight).sum()
    return total
