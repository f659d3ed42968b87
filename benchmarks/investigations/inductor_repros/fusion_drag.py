"""Smallest reproduction (for an upstream report) of a vertical fusion that drags a whole traversal's backward early.

Stock torch only, CPU, one thread, about a minute.  Two checkpointed residual MLP blocks run twice in one step
(the structure of pytorch#193193): Inductor fuses the two traversals' gradient sums of a parameter (one reads the
other's partial sum); the fused node takes the earlier node's place (``Scheduler.fuse_nodes_once`` sorts by
``min_order``) and ``topological_sort_schedule`` runs the later one's ancestors first, so the other traversal's backward
runs early and both stay live.  Measured on torch 2.13 (the work log's session 12: `git show
8fb59be:benchmarks/RESULTS.md`): default 23.44 MiB, ``max_fusion_size=1`` (no fusion) 11.26 MiB, gradients equal.
fxremat's compiles refuse such fusions (passes/_torch_private/scheduler.py, ``inductor_vetoes_dragging_fusions``): 13.13
MiB (its own split, 13.69 without any fusion).
Run: ``python benchmarks/investigations/inductor_repros/fusion_drag.py``."""

import copy
import gc

import torch
import torch._inductor.codegen.wrapper as W
from torch._inductor.utils import fresh_cache
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.manual_seed(0)
B, S, D, H = 4, 256, 192, 768  # input (B, S, D); 2 residual MLP blocks D -> H -> D, run twice


class Net(torch.nn.Module):  # each block under non-reentrant checkpoint
    def __init__(s):
        super().__init__()
        s.ups = torch.nn.ModuleList(torch.nn.Linear(D, H) for _ in range(2))
        s.downs = torch.nn.ModuleList(torch.nn.Linear(H, D) for _ in range(2))

    def block(s, i, x):
        return x + s.downs[i](torch.nn.functional.gelu(s.ups[i](x)))

    def run(s, x):
        for i in range(2):
            x = checkpoint(s.block, i, x, use_reentrant=False)
        return x

    def forward(s, x, c):  # the same blocks over x, then over (first output + c)
        f = s.run(x)
        return (f.square().mean() + s.run(f + c).square().mean()) * 0.5


estimates = []  # Inductor's own overall_peak_memory, one per graph that plans buffer reuse
_init = W.EfficientPeakEstimate.__init__


def _record(self):
    _init(self)
    estimates.append(self.overall_peak_memory)


W.EfficientPeakEstimate.__init__ = _record


def step_peak(model, run, x):  # peak of the running sum of profiler memory events, above the start
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        run(*x).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run(*x).backward()
    gc.enable()
    ev = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    total = peak = 0
    for _, n in ev:
        total += n
        peak = max(peak, total)
    return peak


base, x = Net(), (torch.randn(B, S, D), torch.randn(B, S, D))
ref = copy.deepcopy(base)
ref(*x).backward()
peaks = {}
for name, opts in (("default", {}), ("max_fusion_size=1", {"max_fusion_size": 1})):
    torch._dynamo.reset()
    estimates.clear()
    model = copy.deepcopy(base)
    with fresh_cache():  # an empty Inductor cache: really compile
        peaks[name] = step_peak(model, torch.compile(model, options=opts), x)
    err = max(
        ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
        for p, r in zip(model.parameters(), ref.parameters())
    )
    est = f", Inductor's backward estimate {estimates[-1] / 2**20:.2f} MiB" if estimates else ""
    print(f"{name}: step peak {peaks[name] / 2**20:.2f} MiB, max rel grad error vs eager {err:.1e}{est}")
a, b = peaks.values()
print(f"default / no-fusion = {a / b:.3f}  (+{(a - b) / 2**20:.2f} MiB)")
