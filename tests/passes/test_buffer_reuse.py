"""fxremat's compiles run without Inductor's buffer reuse unless the user set it (passes/_torch_private/
buffer_reuse.py); the simulator counts the reuse pool's held bytes only where the reuse is on (passes/walk.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import run_aot

import fxremat
from fxremat.backend import backend_from_compile_args
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes.liveness import simulate_step


class SwiGLUStack(nn.Module):
    """Recompute-heavy at memory_budget=0.0: each block's freed buffers are of the next block's sizes, which is
    where Inductor's pool holds them (``buffer_pool._pool_held``)."""

    def __init__(self, dim=64, inner=172, layers=4):
        super().__init__()
        self.gate = nn.ModuleList(nn.Linear(dim, inner, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(dim, inner, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(inner, dim, bias=False) for _ in range(layers))

    def forward(self, x):
        for gate, up, down in zip(self.gate, self.up, self.down):
            x = x + down(nn.functional.silu(gate(x)) * up(x))
        return x


def _split(**options):
    """fxremat's split of the stack (aot_autograd, no-op compilers), its report and num_fwd_outputs."""
    reports, splits = [], []
    partition = fxremat.make_partition_fn(Options.create(compare_default=True, **options), reports)

    def capturing(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        fw, bw = partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        splits.append((fw, bw, num_fwd_outputs))
        return fw, bw

    torch.manual_seed(0)
    run_aot(SwiGLUStack(), (torch.randn(2, 128, 64),), capturing)
    return splits[0], reports[0]


def test_the_simulated_pool_holds_bytes_only_where_inductor_reuses_buffers():
    (fw, bw, n), report = _split(memory_budget=0.0)
    with tp.simulating_buffer_reuse(True):
        with_reuse = simulate_step(fw, bw, n).peak_bytes
    with tp.simulating_buffer_reuse(False):
        without = simulate_step(fw, bw, n).peak_bytes
    assert with_reuse > without
    # outside a compile, the simulator models fxremat's default compile (no reuse), the report too
    assert simulate_step(fw, bw, n).peak_bytes == without == report.simulated_peak_bytes


def test_the_reports_baseline_is_simulated_with_stock_inductors_reuse(monkeypatch):
    """PyTorch's split is what stock Inductor compiles (buffer reuse on unless the user's config says otherwise):
    the report's baseline models that, so it compares with the step ``backend="inductor"`` measures; fxremat's own
    split is simulated as fxremat compiles it, also when the simulation is deferred to the first read."""
    import fxremat.partition as partition

    seen = []
    real = partition.simulate_step

    def recording(*args, **kwargs):
        seen.append(tp.inductor_reuses_buffers())
        return real(*args, **kwargs)

    monkeypatch.setattr(partition, "simulate_step", recording)
    _, report = _split()
    assert report.baseline_simulated_peak_bytes > 0 and seen[-1] is True
    assert report.simulated_peak_bytes > 0 and seen[-2:] in ([True, False], [False, True])
    assert set(seen) == {True, False}


def test_the_compiles_buffer_reuse_is_fxremats_unless_its_options_set_it(monkeypatch):
    """The patch fxremat hands ``compile_fx``: reuse off by default, the options' setting where they name it (a
    user's settings are a contract), in both ways of configuring the backend; and what the simulator sees meanwhile
    (the compile's setting, and stock Inductor's for the report's baseline)."""
    import torch._inductor.compile_fx as compile_fx_module

    from fxremat_passes._torch_private import buffer_reuse

    seen = []

    def recording_compile_fx(gm, example_inputs, config_patches=None, **kwargs):
        patch = {k: v for k, v in (config_patches or {}).items() if k == "allow_buffer_reuse"}
        seen.append((patch, tp.inductor_reuses_buffers(), buffer_reuse.stock_reuses_buffers()))
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", recording_compile_fx)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    for backend in (
        fxremat.backend(),
        fxremat.backend(inductor_options={"allow_buffer_reuse": True}),
        backend_from_compile_args(options={"allow_buffer_reuse": True}),
    ):
        torch._dynamo.reset()
        torch.compile(model, backend=backend)(x)
    torch._dynamo.reset()
    off, on = {"allow_buffer_reuse": False}, {"allow_buffer_reuse": True}
    assert seen == [(off, False, True), (on, True, True), (on, True, True)]
    with pytest.raises(ValueError, match="not Inductor config names"):
        fxremat.backend(inductor_options={"allow_buffer_reuses": True})
