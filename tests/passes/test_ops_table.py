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
