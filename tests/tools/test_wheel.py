"""The installed wheel is complete: ``pyproject.toml`` lists its packages by hand, so a subpackage left out would
install a fxremat that fails on first use.  Builds the wheel, installs it into a folder of its own and imports every
module from there (docs/ARCHITECTURE.md's packages)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_names() -> list[str]:
    names = []
    for package, folder in (("fxremat", ROOT / "fxremat"), ("fxremat_passes", ROOT / "passes")):
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_wheel_installs_every_module(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # pip's isolated build, as `pip install` builds it (a venv's own setuptools may be too old to build a wheel)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("fxremat-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    names = _module_names()
    assert len(names) > 90
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\nprint(len(sys.argv) - 1)"
    # from the installed folder alone: not the checkout (the working directory is the temporary folder)
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); exec({code!r})", *names],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(len(names))
