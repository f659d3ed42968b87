"""What the two one-file examples of this folder change (README.md): the FLOPs fxremat prices one ``aten._int_mm``
at, and the simulated step of ``example("dropout")``.  Run it before and after ``git apply``:

    OMP_NUM_THREADS=1 python docs/examples/check_examples.py
"""

from __future__ import annotations

import pathlib
import sys

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat.examples import example
from fxremat_passes.graph.costs import count_flops
from fxremat_passes.graph.ops import op_class

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from helpers import run_fxremat_aot  # noqa: E402  (tests/helpers.py: the partition through AOTAutograd)


def int_mm_flops() -> int:
    """An int8 (64 x 128) @ (128 x 32) product: 2 * 64 * 128 * 32 = 524288 FLOPs."""
    a = torch.randint(-128, 127, (64, 128), dtype=torch.int8)
    b = torch.randint(-128, 127, (128, 32), dtype=torch.int8)
    gm = make_fx(torch.ops.aten._int_mm.default, tracing_mode="fake")(a, b)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    return count_flops(node, op_class(node))


def dropout_step() -> tuple[int, str]:
    model, inputs = example("dropout")
    report = run_fxremat_aot(model.train(), inputs, strict=True)[3][0]
    return report.simulated_peak_bytes, report.simulated_peak_at


if __name__ == "__main__":
    print("aten._int_mm FLOPs:", int_mm_flops())
    peak, where = dropout_step()
    print(f"example('dropout') simulated peak: {peak} B at {where}")
