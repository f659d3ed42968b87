"""Per-element weights of elementwise ops (``fxremat_passes.graph.ops.POINTWISE_FLOP_WEIGHTS``) in seconds, not minutes.

    python benchmarks/investigations/pointwise_eager.py [--numel 4194304] [--repeats 15]

Each op runs eagerly (ATen's vectorised CPU kernel, the same at::vec/SLEEF code Inductor's CPU kernels call) on a
``numel`` fp32 tensor, one thread, out of place, interleaved rounds, median.  Its compute beyond the memory-bound
floor is its time minus that of a multiplication by a scalar (unary ops) or an add of two tensors (ops with two
tensor inputs) over the same bytes; the weight is that extra per element over the price of one add inside a fused
Inductor kernel (``--flop-ns``, measured by benchmarks/investigations/pointwise_weights.py: 0.076 ns here).  A
lower bound of the fused cost: in a fused chain nothing hides the op's latency (tanh 50, exp 12 measured that way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

aten = torch.ops.aten
F = torch.nn.functional

UNARY = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "pow (x**0.7)": lambda x: torch.pow(x, 0.7),
    "sin": torch.sin,
    "cos": torch.cos,
    "gelu": F.gelu,
    "gelu (tanh)": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}
BINARY = {
    "div": lambda g, x: g / x,
    "gelu_backward": aten.gelu_backward,
    "silu_backward": aten.silu_backward,
    "tanh_backward": aten.tanh_backward,
    "sigmoid_backward": aten.sigmoid_backward,
}


def main(argv=None) -> int:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--flop-ns", type=float, default=0.076)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.rand(args.numel) * 0.5 + 0.5
    g = torch.rand(args.numel)
    runs = {"floor: mul": lambda: x * 1.0001, "floor: add": lambda: g + x}
    runs.update({name: (lambda f=f: f(x)) for name, f in UNARY.items()})
    runs.update({name: (lambda f=f: f(g, x)) for name, f in BINARY.items()})
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    ns = {name: statistics.median(s) * 1e9 / args.numel for name, s in samples.items()}
    rows = []
    for name in [*UNARY, *BINARY]:
        floor = ns["floor: add"] if name in BINARY else ns["floor: mul"]
        rows.append(
            [name, f"{ns[name]:.3f}", f"{ns[name] - floor:.3f}", f"{max(0.0, ns[name] - floor) / args.flop_ns:.1f}"]
        )
    print(
        f"eager, 1 thread, {args.numel:,} fp32, median of {args.repeats}; floors: mul {ns['floor: mul']:.3f}, "
        f"add {ns['floor: add']:.3f} ns/element"
    )
    print(tabulate(rows, headers=["op", "ns/element", "beyond floor", "weight (add = 1)"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
