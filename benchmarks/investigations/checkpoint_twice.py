"""Issue #22's model B, written here: checkpointed blocks run twice in one step (the structure of pytorch#193193).

    python benchmarks/investigations/checkpoint_twice.py [--model b|a] [--blocks 3] [--width 192] [--batch 4]
        [--seq 256]
                                          [--configs eager inductor fxremat fxremat_peak_0.0 inductor_no_fusion]

``--model a``: issue #22's model A instead (after pytorch#120381): ``--blocks`` checkpointed ``Linear -> LayerNorm
-> GELU`` layers, run once.

A stack of pre-norm transformer blocks (SDPA attention, MLP 4x), each under ``torch.utils.checkpoint``
(non-reentrant), run over the input and then again over the first pass's output plus a context (a CoCa-style
text-then-multimodal pass through the same weights).  Per configuration, in this process (Dynamo reset between):
the step's peak above the bytes live at its start (CPU profiler memory events, ``fxremat.measure``), after two
warm-up steps, gradients set to None before; the largest gradient error against eager.  ``inductor_no_fusion`` is
Inductor's default partitioner with ``max_fusion_size=1`` (no fusion at all), the issue's diagnostic: if it meets
eager+checkpoint's peak while the default does not, Inductor's fusion is what inflates the compiled backward.
``fxremat_every_fusion`` is fxremat's default with the fusion veto off (``fusion.DRAG_FACTOR`` unbounded: every
fusion Inductor would make, as before issue #22's fix; docs/DESIGN.md §6); ``fxremat_buffer_reuse`` is fxremat's
default without Inductor's buffer reuse; ``fxremat_stock_reuse_bound`` bounds the reuse by stock Inductor's peak
estimate (kernel-local buffers counted) instead of by the bytes really allocated (docs/DESIGN.md §6).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and measures

CONFIGS = (
    "eager",
    "inductor",
    "fxremat",
    "fxremat_peak_0.0",
    "fxremat_no_buffer_reuse",
    "fxremat_stock_reuse_bound",
    "fxremat_every_fusion",
    "inductor_no_fusion",
)


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TwicePass(torch.nn.Module):
    """The same checkpointed blocks over x, then over (their output + context)."""

    def __init__(self, blocks: int, width: int, heads: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(blocks))

    def run(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        first = self.run(x)
        return (first.square().mean() + self.run(first + context).square().mean()) * 0.5


class Layer(torch.nn.Module):
    """Model A's layer: Linear -> LayerNorm -> GELU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.ln = torch.nn.Linear(width, width), torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.ln(self.fc(x)))


class LayerStack(torch.nn.Module):
    """Model A: each layer under its own checkpoint, run once."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return x.square().mean()


def _compiled(model: torch.nn.Module, config: str):
    """(callable, context manager for the first step)."""
    import contextlib

    import fxremat

    if config == "eager":
        return model, contextlib.nullcontext()
    if config == "inductor":
        return torch.compile(model, backend="inductor"), contextlib.nullcontext()
    if config == "inductor_no_fusion":
        return torch.compile(model, options={"max_fusion_size": 1}), contextlib.nullcontext()
    options = {"peak_budget": 0.0} if config == "fxremat_peak_0.0" else {}
    if config == "fxremat_no_buffer_reuse":
        options = {"inductor_options": {"allow_buffer_reuse": False}}
    compiled = torch.compile(model, backend=fxremat.backend(compare_default=False, **options))
    if config == "fxremat_stock_reuse_bound":
        from bench_measure import stock_reuse_bound

        return compiled, stock_reuse_bound()
    return compiled, _every_fusion() if config == "fxremat_every_fusion" else contextlib.nullcontext()


def _every_fusion():
    """The fusion veto off for a compile (the veto's factor is a constant of fxremat's, not in the cache key: an
    empty Inductor cache)."""
    import contextlib

    from fxremat_passes import _torch_private as tp
    from fxremat_passes.simulator import fusion

    stack = contextlib.ExitStack()
    stack.enter_context(tp.fresh_inductor_cache())
    factor, fusion.DRAG_FACTOR = fusion.DRAG_FACTOR, 10**30
    stack.callback(setattr, fusion, "DRAG_FACTOR", factor)
    return stack


def measure(config: str, base: torch.nn.Module, inputs: tuple, expected: dict) -> dict:
    import grad_rule

    from fxremat.measure import step_peak_bytes

    torch._dynamo.reset()
    model = copy.deepcopy(base)
    run, context = _compiled(model, config)
    with context:
        run(*inputs).backward()
    errors, _ = grad_rule.relative_errors({k: p.grad for k, p in model.named_parameters()}, expected)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        run(*inputs).backward()
    model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(lambda: run(*inputs).backward(), "cpu")
    return dict(config=config, peak_bytes=peak, grad_error=max(errors.values()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("b", "a"), default="b")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = (args.batch, args.seq, args.width)
    if args.model == "a":
        base, inputs = LayerStack(args.blocks, args.width), (torch.randn(shape),)
    else:
        base, inputs = TwicePass(args.blocks, args.width), (torch.randn(shape), torch.randn(shape))
    reference = copy.deepcopy(base)
    reference(*inputs).backward()
    expected = {k: p.grad for k, p in reference.named_parameters()}
    rows = [measure(config, base, inputs, expected) for config in args.configs]
    eager = next((r["peak_bytes"] for r in rows if r["config"] == "eager"), None)
    print("| configuration | peak MiB | vs eager+checkpoint | gradient error |\n|---|---|---|---|")
    for row in rows:
        ratio = f"{row['peak_bytes'] / eager:.2f}x" if eager else ""
        print(f"| {row['config']} | {row['peak_bytes'] / 2**20:.2f} | {ratio} | {row['grad_error']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
