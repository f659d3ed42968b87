"""The house's import rules (docs/ARCHITECTURE.md): no import cycle among fxremat's and fxremat_passes' modules,
counting every import that runs, inside functions too (a cycle dodged by a late import is still a cycle; an import
under ``if TYPE_CHECKING:`` never runs and names a type only); graph facts and the solver never import the
simulator or plan choice; private torch APIs only under ``passes/_torch_private/``; no
simulator module outside the backend-rule modules tests a device; the simulator reads no live config."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"fxremat": ROOT / "fxremat", "fxremat_passes": ROOT / "passes"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that importing ``name`` (a module or a name in one) loads last, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every module of ours that ``module`` imports, wherever the import stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _running_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            # ``from package import name``: the submodule where ``name`` is one, else the package itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
                found |= _packages_run_first(module, target)
    return found


def _packages_run_first(module: str, target: str) -> set[str]:
    """Importing ``target`` first runs the ``__init__`` of each package above it that is not above ``module`` too
    (those are being imported already): ``from .backends.rules import X`` runs ``backends/__init__.py``."""
    ours = set()
    parts = target.split(".")
    for k in range(1, len(parts)):
        package = ".".join(parts[:k])
        if package in MODULES and not (module == package or module.startswith(package + ".")):
            ours.add(package)
    return ours


def _running_imports(tree: ast.AST) -> list:
    """Every import statement of ``tree`` but those under ``if TYPE_CHECKING:``."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    assert len(graph) > 60  # the packages were found
    assert _cycles(graph) == []


def test_graph_facts_and_the_solver_never_import_the_simulator_or_plan_choice():
    lower = [m for m in MODULES if m.startswith(("fxremat_passes.graph", "fxremat_passes.solver"))]
    higher = ("fxremat_passes.simulator", "fxremat_passes.choice", "fxremat_passes.rewrite", "fxremat.")
    wrong = {m: sorted(i for i in imports_of(m) if i.startswith(higher)) for m in lower}
    assert not {m: i for m, i in wrong.items() if i}


def test_the_solver_imports_nothing_of_ours_but_the_solver():
    solver = [m for m in MODULES if m.startswith("fxremat_passes.solver")]
    wrong = {m: sorted(i for i in imports_of(m) if not i.startswith("fxremat_passes.solver")) for m in solver}
    assert not {m: i for m, i in wrong.items() if i and i != ["fxremat_passes"]}


PRIVATE = re.compile(r"\btorch\.(_inductor|_functorch|_dynamo|_subclasses|_guards|_higher_order_ops)\b")


def test_private_torch_apis_only_under_torch_private():
    private = ROOT / "passes" / "_torch_private"
    found = []
    for module, path in MODULES.items():
        if private in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                found += [f"{module}:{node.lineno} {n}" for n in names if PRIVATE.search(n) or n.startswith("functorch")]
    assert not found


# A device test: comparing a device or its type, or asking a tensor which device it is on.
DEVICE_TEST = re.compile(
    r"""device(\.type)?\s*(==|!=|\bin\b|\bnot in\b)|(==|!=)\s*["'](cpu|cuda|xpu|mps)["']|\.is_(cuda|cpu)\b|on_cpu\(|\bis_cpu\b"""
)


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """``path``'s lines with comments and docstrings blanked (a device named in prose is no test)."""
    source = path.read_text()
    lines = source.split("\n")
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            for k in range(body[0].lineno - 1, body[0].end_lineno):
                lines[k] = ""
    return [(k + 1, line.split("#")[0]) for k, line in enumerate(lines)]


def test_no_device_test_in_the_passes_outside_the_backend_rules():
    """The simulator's backend is an input (``simulator/inputs.py``): only ``simulator/backends/`` maps a device to
    Inductor's rules for it.  ``fxremat/``'s measuring and routing code may test devices."""
    backends = ROOT / "passes" / "simulator" / "backends"
    found = [
        f"{path.relative_to(ROOT)}:{k}: {line.strip()}"
        for path in sorted((ROOT / "passes").rglob("*.py"))
        if backends not in path.parents
        for k, line in _code_lines(path)
        if DEVICE_TEST.search(line)
    ]
    assert not found


def test_the_device_test_pattern_finds_device_tests():
    for line in ('if val.device.type == "cpu":', "x.is_cuda", "a.device != b.device", 'kind != "cuda"'):
        assert DEVICE_TEST.search(line), line
    assert not DEVICE_TEST.search("backend_for_device(device_type)")


# What reads the config in force (Inductor's, functorch's, mkldnn's switch, a compile's buffer reuse): read once per
# partition into the simulator's inputs (``fxremat/compile_inputs.py`` ``simulator_inputs``), never by the simulator.
LIVE_CONFIG = re.compile(
    r"\b(inductor_config_value|inductor_reorders_for_peak_memory|inductor_buffer_reuse|stock_buffer_reuse"
    r"|mkldnn_enabled|inductor_config_patched|functorch_knob|inductor_layout_switches_at_default)\(|"
    r"_inductor\.config|_inductor import config|backends\.mkldnn\.enabled"
)


def test_the_simulator_reads_no_live_config():
    """A simulated step depends on its ``SimulatorInputs`` alone (docs/DESIGN.md §6.0;
    ``tests/passes/test_layout_inputs.py`` checks the answer itself)."""
    simulator = ROOT / "passes" / "simulator"
    found = [
        f"{path.relative_to(ROOT)}:{k} {line.strip()}"
        for path in sorted(simulator.rglob("*.py"))
        for k, line in _code_lines(path)
        if LIVE_CONFIG.search(line)
    ]
    assert not found


def test_the_live_config_pattern_finds_live_reads():
    for line in ("tp.inductor_reorders_for_peak_memory()", "from torch._inductor import config", "tp.mkldnn_enabled()"):
        assert LIVE_CONFIG.search(line), line
    assert not LIVE_CONFIG.search("with tp.mkldnn_enabled_as(inputs.mkldnn_enabled):")


def test_small_modules_and_short_functions():
    """One job per module: at most 500 lines a module, 60 a function (docs/ARCHITECTURE.md)."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    long_modules = [f"{m}: {n}" for m, n in sizes.items() if n > 500]
    long_functions = [
        f"{m}.{node.name}: {node.end_lineno - node.lineno + 1}"
        for m, p in MODULES.items()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_the_architecture_page_names_every_module():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    unnamed = []
    for path in sorted([*(ROOT / "passes").rglob("*.py"), *(ROOT / "fxremat").rglob("*.py")]):
        folder = path.parent.relative_to(ROOT).as_posix()
        # named as ``module.py`` in its package's row, whose first cell names the package's folder
        rows = [line for line in page.splitlines() if line.startswith(f"| `{folder}/`")]
        if path.name == "__init__.py" and rows:
            continue  # a package's face: named by its package's row
        if not any(f"`{path.name}`" in row or f"`{path.name} " in row or f"{path.name}`" in row for row in rows):
            unnamed.append(path.relative_to(ROOT).as_posix())
    assert not unnamed
