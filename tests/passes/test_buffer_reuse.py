"""fxremat's compiles bound Inductor's buffer reuse by the bytes really allocated (passes/_torch_private/
buffer_reuse.py); the simulator replays the pool as the compile runs it: stock Inductor's bound, fxremat's, or none
(passes/simulator/walk.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import run_aot

import fxremat
from fxremat.backend import backend_from_compile_args
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import buffer_reuse
from fxremat_passes.simulator.inputs import SimulatorInputs
from fxremat_passes.simulator.liveness import simulate_step


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


def test_the_simulated_pool_holds_fewer_bytes_under_fxremats_bound():
    (fw, bw, n), report = _split(memory_budget=0.0)
    peaks = {}
    default = SimulatorInputs.default("cpu")
    for mode in (tp.ESTIMATED, tp.ALLOCATED, None):
        peaks[mode] = simulate_step(fw, bw, n, inputs=default.with_changes(buffer_reuse=mode)).peak_bytes
    assert peaks[tp.ESTIMATED] > peaks[tp.ALLOCATED] >= peaks[None]
    # given no inputs, the simulator models fxremat's compile under Inductor's defaults (reuse on), the report too
    assert simulate_step(fw, bw, n).peak_bytes == peaks[tp.ALLOCATED] == report.simulated_peak_bytes


def test_the_reports_baseline_is_simulated_with_stock_inductors_reuse(monkeypatch):
    """PyTorch's split is what stock Inductor compiles (buffer reuse on unless the user's config says otherwise):
    the report's baseline models that, so it compares with the step ``backend="inductor"`` measures; fxremat's own
    split is simulated as fxremat compiles it, also when the simulation is deferred to the first read."""
    import fxremat.simulated as simulated

    seen = []
    real = simulated.simulate_step

    def recording(*args, inputs, **kwargs):
        seen.append(inputs.buffer_reuse)
        return real(*args, inputs=inputs, **kwargs)

    monkeypatch.setattr(simulated, "simulate_step", recording)
    _, report = _split()
    assert report.baseline_simulated_peak_bytes > 0 and seen[-1] == tp.ESTIMATED
    assert report.simulated_peak_bytes > 0 and seen[-2:] in ([tp.ESTIMATED, tp.ALLOCATED], [tp.ALLOCATED, tp.ESTIMATED])
    assert set(seen) == {tp.ESTIMATED, tp.ALLOCATED}


def test_the_simulator_follows_the_compiles_buffer_reuse_setting(monkeypatch):
    """What the simulator replays during fxremat's compile: fxremat's bound where the compile reuses buffers, no
    pool where the options turn the reuse off (a user's settings are a contract), in both ways of configuring the
    backend; stock Inductor's bound for the report's baseline.  fxremat patches the reuse only as the options say."""
    import torch._inductor.compile_fx as compile_fx_module

    seen = []

    def recording_compile_fx(gm, example_inputs, config_patches=None, **kwargs):
        patch = {k: v for k, v in (config_patches or {}).items() if k == "allow_buffer_reuse"}
        seen.append((patch, tp.inductor_buffer_reuse(), tp.stock_buffer_reuse()))
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", recording_compile_fx)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    for backend in (
        fxremat.backend(),
        fxremat.backend(inductor_options={"allow_buffer_reuse": False}),
        backend_from_compile_args(options={"allow_buffer_reuse": False}),
    ):
        torch._dynamo.reset()
        torch.compile(model, backend=backend)(x)
    torch._dynamo.reset()
    off = {"allow_buffer_reuse": False}
    assert seen == [({}, tp.ALLOCATED, tp.ESTIMATED), (off, None, tp.ESTIMATED), (off, None, tp.ESTIMATED)]
    with pytest.raises(ValueError, match="not Inductor config names"):
        fxremat.backend(inductor_options={"allow_buffer_reuses": True})


def test_saved_weights_and_their_views_are_marked_as_never_freed_for_inductor():
    """A weight (or a transposed weight) saved for backward keeps its storage after its last use there: Inductor's
    estimate would count it freed; fxremat marks it on the backward graph module (``mark_inputs_never_freed``), and
    nothing else."""
    from fxremat_passes.graph.costs import alias_root

    (fw, bw, n), _ = _split()
    marked = bw.meta[buffer_reuse.NEVER_FREED_KEY]
    saved = {node.name: node for node in fw.graph.output_node().args[0][n:]}
    outliving = {name for name, node in saved.items() if alias_root(node).op == "placeholder"}
    assert marked and marked == outliving
    assert {p.name for p in bw.graph.nodes if p.op == "placeholder"} >= marked


class _Node:
    """A scheduler node as ``_flushed_after`` reads it."""

    def __init__(self, kind: str, device: str | None = "cpu"):
        self.kind, self.device = kind, device

    def is_extern(self):
        return self.kind == "extern"

    def is_template(self):
        return self.kind == "template"

    def get_device(self):
        return None if self.device is None else torch.device(self.device)


def test_a_cpu_kernel_groups_reads_are_freed_when_the_group_is_flushed():
    """Inductor's C++ backend frees what a group of generated kernels read only before the next extern kernel (or
    template, or at the end); an extern kernel frees its reads after itself, a kernel on another device too."""
    nodes = [_Node("kernel"), _Node("kernel"), _Node("nop", None), _Node("extern"), _Node("kernel"), _Node("template")]
    nodes += [_Node("kernel", "cuda"), _Node("kernel")]
    from fxremat_passes.simulator.backends import backend_for_device

    groups = lambda device_type: backend_for_device(device_type).groups_generated_kernels  # noqa: E731
    assert buffer_reuse._flushed_after(nodes, groups) == [2, 2, 2, 3, 4, 5, 6, 7]


class _Info:
    def __init__(self, end_step: int):
        self.end_step = end_step


def test_a_result_written_in_place_keeps_its_inputs_storage_alive_to_its_own_end():
    """``buf2`` is written over ``buf1``, itself over ``buf0``: one storage, freed after the last of the three; a
    graph output among them is never freed (-1); a write over a buffer the estimate does not hold is its own."""
    infos = {name: _Info(end) for name, end in (("buf0", 3), ("buf1", 5), ("buf2", 9), ("buf3", 4), ("buf4", -1))}
    infos["buf5"], infos["buf6"] = _Info(2), _Info(7)
    kept = list(infos.items())
    reuses = {"buf1": "buf0", "buf2": "buf1", "buf4": "buf3", "buf6": "removed_buf"}
    ends = {id(info): end for info, end in buffer_reuse._storage_ends(kept, reuses)}
    assert ends == {id(infos["buf0"]): 9, id(infos["buf3"]): -1, id(infos["buf5"]): 2, id(infos["buf6"]): 7}
