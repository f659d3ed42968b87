"""Inductor's entry points and settings that fxremat's face (``fxremat/backend.py``, ``fxremat/cli.py``) uses: its
compile function, its cache folder, its config names and modes, and AOTAutograd's boxed calling convention.  Private
APIs, kept here with the rest (``tests/passes/test_options_and_private.py`` checks each name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch._inductor.config as inductor_config


def compile_fx(gm, example_inputs, config_patches: dict | None = None, **inner):
    """Inductor's ``compile_fx``: the compile ``backend="inductor"`` runs (``inner``: its ``inner_compile``)."""
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    return inductor_compile_fx(gm, example_inputs, config_patches=config_patches, **inner)


def inductor_cache_dir() -> Path:
    """Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR`` or its default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def inductor_config_value(name: str) -> Any:
    """The value of ``torch._inductor.config.<name>`` in force now (a config patch included)."""
    return getattr(inductor_config, name)


def inductor_config_names() -> set[str]:
    """Every name ``torch._inductor.config`` knows (empty where the config module does not list them)."""
    return set(inductor_config._config.keys()) if hasattr(inductor_config, "_config") else set()


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor config a ``torch.compile`` mode stands for (``"max-autotune"`` ->
    ``{"max_autotune": True, ...}``)."""
    from torch._inductor import list_mode_options

    return list_mode_options(mode)


def boxed(function):
    """``function`` in AOTAutograd's boxed calling convention (a no-op compiler's return value)."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(function)
