"""Inductor's ``compile_fx`` without code generation, for tests of how a training stack hands fxremat's backend its
graphs (Trainer, Accelerator, Lightning, per-block compile): the backend, its options, its partitioner and its
reports are the real ones, only Inductor's C++/Triton code generation is left out (a C++ compile takes minutes on
a small CPU machine).  What the partitioner sees is what Inductor would hand it: AOTAutograd set up as
``compile_fx`` sets it up (its decompositions, mutations kept in the graph), Inductor's joint-graph passes first,
and Inductor's config patched as ``compile_fx(config_patches=...)`` patches it; forward and backward then run as FX
graphs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch._inductor.compile_fx as _compile_fx_module
from functorch.compile import make_boxed_func
from torch._inductor import config as inductor_config


def _run_as_fx(gm, example_inputs):
    return make_boxed_func(gm.forward)


def compile_fx_without_codegen(gm, example_inputs, config_patches: dict[str, Any] | None = None, **_: Any):
    """What ``compile_fx(gm, example_inputs, config_patches=...)`` returns, with forward and backward run as FX
    graphs.  The partitioner is ``config_patches["custom_partitioner_fn"]``, as fxremat's backend passes it;
    ``inner_compile`` (a layout hook of Inductor's code generation) has nothing to act on here."""
    from . import after_inductor_joint_passes, aot_autograd_as_inductor

    patches = dict(config_patches or {})
    partitioner = patches.get("custom_partitioner_fn")
    if partitioner is None:
        raise ValueError("compile_fx_without_codegen: config_patches has no custom_partitioner_fn (fxremat's backend)")
    backend = aot_autograd_as_inductor(after_inductor_joint_passes(partitioner), _run_as_fx)
    with inductor_config.patch(patches):
        return backend(gm, example_inputs)


@contextlib.contextmanager
def inductor_without_codegen() -> Iterator[None]:
    """Within: every ``compile_fx`` fxremat's backend calls is ``compile_fx_without_codegen`` (fxremat imports
    ``compile_fx`` at each call, so the swap reaches it); the real one is put back on exit."""
    real = _compile_fx_module.compile_fx
    _compile_fx_module.compile_fx = compile_fx_without_codegen
    try:
        yield
    finally:
        _compile_fx_module.compile_fx = real
