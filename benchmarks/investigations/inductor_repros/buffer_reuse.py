"""Smallest reproduction (for an upstream report) of Inductor's buffer reuse raising the peak it means to respect.

Stock torch only, CPU, one thread, about a minute.  ``AllocateLine.should_reuse_buffer`` (torch/_inductor/codegen/
wrapper.py) pools a dead buffer for a later allocation of its size while ``peak_between + size <=
overall_peak_memory`` of ``EfficientPeakEstimate``; that estimate's timeline (``memory.compute_memory_timeline``)
counts a fused kernel's in-place result (``codegen_inplace_reuse``) as a new buffer beside the input it overwrites (here
6 MiB at block 1's gelu backward), and the false headroom lets two 6 MiB buffers of block 2's backward be held through
the real peak.  Measured on torch 2.13 (the work log's session 12: `git show 8fb59be:benchmarks/RESULTS.md`): default
27.00 MiB, Inductor's estimate 30.01 MiB, ``allow_buffer_reuse=False`` 24.01 MiB, gradients equal; fxremat's compiles
(reuse bounded by the bytes really allocated, passes/_torch_private/buffer_reuse.py) measure 24.01 MiB with reuse on.
Run: ``python benchmarks/investigations/inductor_repros/buffer_reuse.py``."""

import copy
import gc

import torch
import torch._inductor.codegen.wrapper as W
from torch._inductor.utils import fresh_cache
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.manual_seed(0)
B, S, D, H = 2, 512, 384, 1536  # input (B, S, D); 2 residual MLP blocks D -> H -> D


class Net(torch.nn.Module):  # each block under non-reentrant checkpoint
    def __init__(s):
        super().__init__()
        s.ups = torch.nn.ModuleList(torch.nn.Linear(D, H) for _ in range(2))
        s.downs = torch.nn.ModuleList(torch.nn.Linear(H, D) for _ in range(2))

    def block(s, i, x):
        return x + s.downs[i](torch.nn.functional.gelu(s.ups[i](x)))

    def forward(s, x):
        for i in range(2):
            x = checkpoint(s.block, i, x, use_reentrant=False)
        return x.square().mean()


estimates = []  # Inductor's own overall_peak_memory, one per graph that plans buffer reuse
_init = W.EfficientPeakEstimate.__init__


def _record(self):
    _init(self)
    estimates.append(self.overall_peak_memory)


W.EfficientPeakEstimate.__init__ = _record


def step_peak(model, run, x):  # peak of the running sum of profiler memory events, above the start
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        run(x).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run(x).backward()
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


base, x = Net(), torch.randn(B, S, D)
ref = copy.deepcopy(base)
ref(x).backward()
peaks = {}
for name, opts in (("default", {}), ("allow_buffer_reuse=False", {"allow_buffer_reuse": False})):
    torch._dynamo.reset()
    estimates.clear()
    model = copy.deepcopy(base)
    with fresh_cache():  # an empty Inductor cache: really compile
        peaks[name] = step_peak(model, torch.compile(model, options=opts), x)
    err = max(
        ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
        for p, r in zip(model.parameters(), ref.parameters())
    )
    est = f", Inductor's backward estimate (EfficientPeakEstimate) {estimates[-1] / 2**20:.2f} MiB" if estimates else ""
    print(f"{name}: step peak {peaks[name] / 2**20:.2f} MiB, max rel grad error vs eager {err:.1e}{est}")
a, b = peaks.values()
print(f"default / no-reuse = {a / b:.3f}  (+{(a - b) / 2**20:.2f} MiB)")
