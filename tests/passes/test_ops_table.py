"""Issue #18: an op is named in one place.  Every op set and single op that a pass matches lives in ``passes/graph/ops.py``
(with its FLOP price); ``passes/_torch_private/`` may name the ops whose existence depends on the torch version."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALLOWED = {ROOT / "passes" / "graph" / "ops.py"}


def _op_names(path: pathlib.Path) -> list[str]:
    """``torch.ops...`` and ``aten`` (the module alias) in the code of ``path``, not in its strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        torch_ops = isinstance(node, ast.Attribute) and node.attr == "ops" and getattr(node.value, "id", "") == "torch"
        if torch_ops or (isinstance(node, ast.Name) and node.id == "aten"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_outside_ops_names_an_op():
    private = ROOT / "passes" / "_torch_private"
    paths = [p for p in [*(ROOT / "passes").rglob("*.py"), *(ROOT / "fxremat").rglob("*.py")] if private not in p.parents]
    assert len(paths) > 20  # the packages were found
    named = [where for p in sorted(paths) if p not in ALLOWED for where in _op_names(p)]
    assert not named, f"ops named outside passes/graph/ops.py (add them to ops.py and import them): {named}"


def test_attention_flops_count_every_query_head_on_every_release():
    """Grouped-query attention (key and value with fewer heads): torch 2.11's FlopCounterMode formula asserts on the
    shapes (a GQA model fell back to PyTorch's partitioner there); fxremat's own count broadcasts the heads."""
    import torch.utils.flop_counter as flop_counter

    from fxremat_passes.graph.flop_formulas import sdpa_backward_flops, sdpa_flops

    q, k, v = (2, 8, 16, 32), (2, 2, 24, 32), (2, 2, 24, 16)
    assert sdpa_flops(q, k, v) == 2 * 2 * 8 * 16 * 24 * (32 + 16)
    assert sdpa_backward_flops(q, k, v) == 2 * 2 * 8 * 16 * 24 * (3 * 32 + 2 * 16)
    full_k, full_v, grad_out = (2, 8, 24, 32), (2, 8, 24, 16), (2, 8, 16, 16)
    assert sdpa_flops(q, full_k, full_v) == flop_counter.sdpa_flop_count(q, full_k, full_v)
    assert sdpa_backward_flops(q, full_k, full_v) == flop_counter.sdpa_backward_flop_count(grad_out, q, full_k, full_v)
