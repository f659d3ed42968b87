"""Measure what one pointwise op costs *inside a fused Inductor kernel* on this CPU, in add/mul equivalents: the
per-element FLOP weights of ``fxremat_passes.graph.ops.POINTWISE_FLOP_WEIGHTS``.

    python benchmarks/investigations/pointwise_weights.py [--numel 4194304] [--repeats 11] [--ops tanh erf ...]

Each op ``f`` is compiled (Inductor, CPU, one thread) into one kernel that applies it ``K`` times in a dependent
chain, ``y = f(y * x + c)``, over a ``numel`` fp32 tensor; the chain is long enough that the kernel is compute
bound (a single ``f(x) + y`` over 4M elements is memory bound and hides everything but the slowest ops).  The cost
of one step per element is the slope between two chain lengths, ``(t(K_hi) - t(K_lo)) / ((K_hi - K_lo) * numel)``,
which cancels the memory traffic and the launch.  The reference chain ``y = y * x + c`` (a mul and an add: two
aten nodes, 2 FLOPs in the model) gives the price of one add/mul, half its step; an op's weight is its step minus
the reference step (the carrier ``y * x + c`` it shares), over that price.  All kernels are compiled first and then
timed in interleaved rounds; the median of the rounds is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

aten = torch.ops.aten

# name -> (f applied to z = y * x + c, c): c keeps the chain bounded and inside the op's domain
OPS = {
    "add/mul": (lambda z, x: z, 0.5),
    "relu": (lambda z, x: torch.relu(z), 0.5),
    "tanh": (lambda z, x: torch.tanh(z), 0.5),
    "sigmoid": (lambda z, x: torch.sigmoid(z), 0.5),
    "erf": (lambda z, x: torch.erf(z), 0.5),
    "exp": (lambda z, x: torch.exp(z), -1.0),
    "log": (lambda z, x: torch.log(z), 2.0),
    "sqrt": (lambda z, x: torch.sqrt(z), 1.0),
    "rsqrt": (lambda z, x: torch.rsqrt(z), 1.0),
    "reciprocal": (lambda z, x: torch.reciprocal(z), 1.0),
    "div (tensor)": (lambda z, x: x / z, 1.0),
    "div (scalar)": (lambda z, x: z / 3.0, 0.5),
    "pow (z**0.7)": (lambda z, x: torch.pow(z, 0.7), 0.5),
    "pow (z**3)": (lambda z, x: torch.pow(z * 0.5, 3), 0.5),  # one extra mul keeps it bounded: subtracted
    "sin": (lambda z, x: torch.sin(z), 0.5),
    "cos": (lambda z, x: torch.cos(z), 0.5),
    "gelu": (lambda z, x: torch.nn.functional.gelu(z), 0.1),
    "gelu (tanh)": (lambda z, x: torch.nn.functional.gelu(z, approximate="tanh"), 0.1),
    "silu": (lambda z, x: torch.nn.functional.silu(z), 0.1),
    "gelu_backward": (lambda z, x: aten.gelu_backward(x, z), 0.1),
    "silu_backward": (lambda z, x: aten.silu_backward(x, z), 0.1),
    "tanh_backward": (lambda z, x: aten.tanh_backward(x, z), 0.1),
    "sigmoid_backward": (lambda z, x: aten.sigmoid_backward(x, z), 0.1),
}
# chain lengths (K_lo, K_hi): the reference chain is cheap per step, so it needs many more steps to be compute bound
EXTRA_MULS = {"pow (z**3)": 1}
CHAINS = {"add/mul": (64, 192), "relu": (32, 96), "div (scalar)": (32, 96), "pow (z**3)": (32, 96)}
DEFAULT_CHAIN = (8, 24)


def chain(f, c: float, steps: int):
    def fn(x):
        y = x
        for _ in range(steps):
            y = f(y * x + c, x)
        return y

    return fn


def main(argv=None) -> int:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 10_000  # one code object, one compile per (op, chain length)
    names = ["add/mul", *[n for n in args.ops if n != "add/mul"]]
    x = torch.rand(args.numel) * 0.5 + 0.5  # in [0.5, 1): every chain stays finite

    kernels = {}
    for name in names:
        f, c = OPS[name]
        for steps in CHAINS.get(name, DEFAULT_CHAIN):
            compiled = torch.compile(chain(f, c, steps), backend="inductor", fullgraph=True)
            out = compiled(x)
            if not torch.isfinite(out).all():
                raise RuntimeError(f"{name}: the chain of {steps} left the op's domain; change its constant")
            kernels[name, steps] = compiled
    samples: dict = {key: [] for key in kernels}
    for round_ in range(args.repeats):
        for key, compiled in kernels.items():  # interleaved: a noisy neighbour slows every op alike
            start = time.perf_counter()
            compiled(x)
            samples[key].append(time.perf_counter() - start)
        print(f"round {round_ + 1}/{args.repeats}: {sum(s[-1] for s in samples.values()):.1f}s", file=sys.stderr)

    def step_ns(name):
        lo, hi = CHAINS.get(name, DEFAULT_CHAIN)
        t_lo, t_hi = statistics.median(samples[name, lo]), statistics.median(samples[name, hi])
        return (t_hi - t_lo) / ((hi - lo) * args.numel) * 1e9

    ref = step_ns("add/mul")
    flop_ns = ref / 2  # the reference step is a mul and an add
    rows = []
    for name in names:
        ns = step_ns(name)
        weight = 1.0 if name == "add/mul" else (ns - ref) / flop_ns - EXTRA_MULS.get(name, 0)
        rows.append([name, f"{ns:.3f}", f"{weight:.1f}"])
    print(f"Inductor CPU, 1 thread, {args.numel:,} fp32 elements, median of {args.repeats} interleaved rounds")
    print(f"one add/mul inside a fused kernel: {flop_ns:.3f} ns/element")
    print(tabulate(rows, headers=["op", "ns/element/step (incl. carrier)", "weight (add/mul = 1)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
