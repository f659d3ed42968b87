"""benchmarks/investigations/gpu_kernel_profile.py: its per-step counts from a profile (on the CPU, top-level ops
stand for the device's kernels) and its table.  The model run itself is Inductor compiles: not here."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_kernel_profile  # noqa: E402


def test_counts_are_per_step_and_the_table_lists_the_ops():
    a = torch.randn(64, 64)

    def step():
        torch.mm(a, a)
        torch.addmm(a, a, a)

    prof = gpu_kernel_profile.profile_steps(step, "cpu", steps=3)
    launched, micros = gpu_kernel_profile.device_totals(prof, "cpu", steps=3)
    assert launched == 2
    assert micros > 0
    table = gpu_kernel_profile.kernel_table(prof)
    assert "aten::addmm" in table and "aten::mm" in table
