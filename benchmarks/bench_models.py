"""The benchmark's models: fxremat's examples and small transformers models with random weights (no downloads).

``build_workload(name, size, device)`` returns a ``Workload``: the model, its inputs, and how a training step
turns its output into a scalar loss.  Every model is built after ``torch.manual_seed(0)``, so two builds in two
processes hold the same weights.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# One table of shapes for every model.  "small" is the reference; "tiny" halves it, "medium" doubles it.  Depth
# stays 2 at tiny (one layer would hide everything that happens between layers) and heads stay 4 at tiny so
# that the head dimension (32) is still a realistic attention shape.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=128, heads=4, vocab=512, batch=1, seq=64),
    "small": dict(layers=2, hidden=256, heads=4, vocab=1024, batch=2, seq=128),
    "medium": dict(layers=4, hidden=512, heads=8, vocab=2048, batch=4, seq=256),
}
# The tests' transformers models (tests/passes/test_costs.py's FLOP checks, tests/tools/test_cut_report.py's GPT-2):
# one layer (more where a test says so), small enough that each traces in about a second.
TEST_SHAPE: dict[str, int] = dict(layers=1, hidden=64, heads=2, ffn=128, vocab=128, batch=2, seq=16)

# llama_stack: fxremat.examples.LlamaStack, a Llama-style stack written in this repository (RMSNorm, RoPE,
# grouped-query attention, SwiGLU; 2 blocks), the "stack of your own" of issue #15.
EXAMPLE_MODELS = ("mlp", "block_sdpa", "block_softmax", "convnet", "stack", "llama_stack")
HF_MODELS = ("gpt2", "llama", "bert", "t5", "vit", "mixtral")
ALL_MODELS = EXAMPLE_MODELS + HF_MODELS
# Not in the default run: a deeper, narrower transformers Llama with more tokens (4x the layers, half the width, 4x
# the tokens of its size), where activations outweigh parameter gradients and the peak of a step depends on how
# recomputation is spread over backward (issue #8's peak-budget comparison; `--models llama_deep`).  Until the
# example above took the name it was called `llama_stack` (older logs in git history mean this model by it).
EXTRA_MODELS = ("llama_deep",)


def llama_deep_shape(shape: dict[str, int]) -> dict[str, int]:
    deeper = dict(layers=4 * shape["layers"], hidden=shape["hidden"] // 2)
    return dict(shape, **deeper, batch=2 * shape["batch"], seq=2 * shape["seq"])


def _sum_loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


@dataclass
class Workload:
    """A model plus one batch.  ``forward(model)`` runs it on the batch; ``loss(output)`` is the scalar to
    differentiate (the sum for plain modules, ``.loss`` for transformers models)."""

    model: torch.nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: Callable[[Any], torch.Tensor] = _sum_loss
    info: dict[str, Any] = field(default_factory=dict)

    def forward(self, model: Callable) -> Any:
        return model(*self.args, **self.kwargs)

    def input_tensors(self) -> list[torch.Tensor]:
        values = [*self.args, *self.kwargs.values()]
        return [v for v in values if isinstance(v, torch.Tensor)]

    def to(self, device: str) -> Workload:
        self.model.to(device)
        self.args = tuple(_to(v, device) for v in self.args)
        self.kwargs = {k: _to(v, device) for k, v in self.kwargs.items()}
        return self


def _to(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _hf_loss(out: Any) -> torch.Tensor:
    return out.loss


def build_workload(name: str, size: str, device: str = "cpu", checkpointed: bool = False) -> Workload:
    """``checkpointed``: every block wrapped in ``torch.utils.checkpoint(..., use_reentrant=False)``
    (``checkpoint_blocks``), as a user who turned on their library's checkpointing switch has it (issue #22)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; one of {sorted(SIZES)}")
    torch.manual_seed(0)
    shape = SIZES[size]
    if name in EXAMPLE_MODELS:
        work = _example(name, shape)
    elif name in HF_MODELS:
        work = _hf_model(name, shape)
    elif name == "llama_deep":
        work = _hf_model("llama", llama_deep_shape(shape))
    else:
        raise ValueError(f"unknown model {name!r}; one of {list(ALL_MODELS + EXTRA_MODELS)}")
    work.info.setdefault("parameters", sum(p.numel() for p in work.model.parameters()))
    work.info.setdefault("class", type(work.model).__name__)
    if checkpointed:
        work.model, work.info["checkpointed"] = checkpoint_blocks(work.model)
    return work.to(device)


class Checkpointed(torch.nn.Module):
    """A block run under ``torch.utils.checkpoint`` (non-reentrant, as every current library switch does)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The model with its blocks wrapped in checkpoint (in place where it has blocks), and how.  A transformers
    model: its own switch (``activation_checkpointing_enable``, or ``gradient_checkpointing_enable`` before it),
    non-reentrant.  fxremat's examples: every entry of a ``blocks`` container, or the whole model where it is one
    block (or an MLP)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=dict(use_reentrant=False))
        return model, "transformers activation_checkpointing_enable"
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
        return model, "transformers gradient_checkpointing_enable"
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (torch.nn.ModuleList, torch.nn.Sequential)):
        for i, block in enumerate(blocks):
            blocks[i] = Checkpointed(block)
        return model, f"{len(blocks)} blocks"
    return Checkpointed(model), "the whole model as one block"


def _examples_module():
    """``fxremat/examples.py`` (torch only) loaded on its own, not through the ``fxremat`` package: a process that
    compiles with Inductor alone must not pay fxremat's import (``compile_time.py`` compares the two).  Within fxremat's
    own process the package's module is reused."""
    import importlib.util

    if "fxremat.examples" in sys.modules:
        return sys.modules["fxremat.examples"]
    name = "fxremat_examples_alone"
    if name not in sys.modules:
        package = importlib.util.find_spec("fxremat")  # finds the package's folder without running its __init__
        spec = importlib.util.spec_from_file_location(name, Path(package.origin).parent / "examples.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _example(name: str, shape: dict[str, int]) -> Workload:
    model, inputs = _examples_module().example(name, batch=shape["batch"], seq=shape["seq"], dim=shape["hidden"])
    return Workload(model, args=tuple(inputs), loss=_sum_loss)


# ---- transformers models -------------------------------------------------------------------------------------


def hf_workload(name: str, shape: dict[str, int]) -> Workload:
    """A transformers model of ``name`` at ``shape`` (``hf_model``) and its batch, built after
    ``torch.manual_seed(0)``, on the CPU in fp32: what benchmarks/gpu_check.py builds at its own sizes, and the tests
    at ``TEST_SHAPE``."""
    torch.manual_seed(0)
    return _hf_model(name, shape)


def hf_model(name: str, shape: dict[str, int], **kwargs) -> torch.nn.Module:
    """The transformers model ``name`` with random weights (never the hub), sdpa attention everywhere so that every
    model meets the same attention op, at ``shape``: ``SIZES``' keys, plus ``ffn`` (the MLP width; 4x ``hidden``
    unless given, 2x for Mixtral), Llama's and Mixtral's ``kv_heads`` and Mixtral's ``experts`` where given.  The one
    place a transformers config is written, for the benchmarks and the tests alike; ``kwargs`` go to
    ``_from_config`` (Mixtral's ``experts_implementation``).  Draws the weights from torch's current random state."""
    import transformers

    transformers.logging.set_verbosity_error()  # random-weight configs trigger harmless warnings on every build
    cls, config = _HF_CONFIGS[name](transformers, shape)
    model = cls._from_config(config, attn_implementation="sdpa", **kwargs)
    if name == "gpt2":
        model.loss_type = "ForCausalLM"  # GPT-2's default loss lookup breaks the graph under Dynamo
    return model


def _hf_model(name: str, shape: dict[str, int]) -> Workload:
    if name == "vit":
        model = hf_model(name, shape)
        image = _vit_image(shape)
        pixels = torch.randn(shape["batch"], 3, image, image)
        labels = torch.randint(0, VIT_LABELS, (shape["batch"],))
        return Workload(model, kwargs=dict(pixel_values=pixels, labels=labels), loss=_hf_loss, info=dict(image=image))
    if name == "mixtral":
        model, experts = _mixtral_with_batched_experts(shape)
        return _lm_workload(model, shape, experts_implementation=experts)
    return _lm_workload(hf_model(name, shape), shape)


def _token_batch(shape: dict[str, int]) -> torch.Tensor:
    return torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))


def _lm_workload(model, shape: dict[str, int], **info) -> Workload:
    ids = _token_batch(shape)
    return Workload(model, kwargs=dict(input_ids=ids, labels=ids), loss=_hf_loss, info=dict(info))


def _gpt2(t, s):
    config = t.GPT2Config(
        n_embd=s["hidden"],
        n_inner=s.get("ffn"),  # None: GPT-2's own 4x
        n_layer=s["layers"],
        n_head=s["heads"],
        vocab_size=s["vocab"],
        n_positions=s["seq"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return t.GPT2LMHeadModel, config


def _llama(t, s):
    config = t.LlamaConfig(
        hidden_size=s["hidden"],
        intermediate_size=s.get("ffn", 4 * s["hidden"]),
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s.get("kv_heads", s["heads"]),  # grouped-query attention where given
        vocab_size=s["vocab"],
        max_position_embeddings=s["seq"],
        attention_dropout=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return t.LlamaForCausalLM, config


def _bert(t, s):
    config = t.BertConfig(
        hidden_size=s["hidden"],
        intermediate_size=s.get("ffn", 4 * s["hidden"]),
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        vocab_size=s["vocab"],
        max_position_embeddings=s["seq"],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return t.BertForMaskedLM, config


def _t5(t, s):
    config = t.T5Config(
        d_model=s["hidden"],
        d_kv=s["hidden"] // s["heads"],
        d_ff=s.get("ffn", 4 * s["hidden"]),
        num_layers=s["layers"],
        num_decoder_layers=s["layers"],
        num_heads=s["heads"],
        vocab_size=s["vocab"],
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return t.T5ForConditionalGeneration, config


VIT_PATCH, VIT_LABELS = 8, 10


def _vit_image(s: dict[str, int]) -> int:
    return VIT_PATCH * round(math.sqrt(s["seq"]))  # about as many patches as the text models have tokens


def _vit(t, s):
    config = t.ViTConfig(
        hidden_size=s["hidden"],
        intermediate_size=s.get("ffn", 4 * s["hidden"]),
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        image_size=_vit_image(s),
        patch_size=VIT_PATCH,
        num_labels=VIT_LABELS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        # set up front: the loss sets it on its first call, and that config mutation recompiles the second step
        problem_type="single_label_classification",
    )
    return t.ViTForImageClassification, config


def _mixtral(t, s):
    config = t.MixtralConfig(
        hidden_size=s["hidden"],
        intermediate_size=s.get("ffn", 2 * s["hidden"]),
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s.get("kv_heads", s["heads"]),
        vocab_size=s["vocab"],
        max_position_embeddings=s["seq"],
        num_local_experts=s.get("experts", 4),
        num_experts_per_tok=2,
        attention_dropout=0.0,
        router_jitter_noise=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return t.MixtralForCausalLM, config


def _mixtral_with_batched_experts(shape: dict[str, int]):
    """``experts_implementation="batched_mm"`` (one bmm over all experts, no data-dependent loop, so no graph
    break) where the installed transformers has it; older releases loop over experts and we say so in the row."""
    try:
        model = hf_model("mixtral", shape, experts_implementation="batched_mm")
    except (TypeError, ValueError) as error:
        model = hf_model("mixtral", shape)
        return model, f"unavailable ({type(error).__name__}: {error}); default loop"
    return model, getattr(model.config, "_experts_implementation", None) or "unknown"


_HF_CONFIGS = dict(gpt2=_gpt2, llama=_llama, bert=_bert, t5=_t5, vit=_vit, mixtral=_mixtral)
