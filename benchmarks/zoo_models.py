"""The third-party zoo's models (``zoo.py``): transformers, timm, diffusers and torchvision models built from a config
with random weights (nothing is downloaded), each with its loss computed inside the compiled module or outside it.

``build(name, size, loss_side)`` returns a ``bench_models.Workload`` after ``torch.manual_seed(0)``:

* ``loss_side="inside"``: the compiled module returns the loss (transformers' ``labels=``; for the vision models a
  wrapper module that applies the loss), so the joint graph holds the whole step;
* ``loss_side="outside"``: the compiled module returns the logits (or the image), and the same loss runs eagerly
  on them, as many training loops write it (``loss = F.cross_entropy(model(x).logits ..., y)``): the logits live
  across the graph's boundary.

Sizes: ``tiny`` (CI: seconds to compile) and ``act``, an activation-dominated size per model (two layers, a long
sequence or a large image: activations and the loss outweigh the parameters' gradients, where plans differ).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from bench_models import Workload

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, batch=1, seq=32, image=32),
    "act": dict(layers=2, hidden=128, heads=4, kv_heads=2, ffn=512, vocab=4096, batch=8, seq=512, image=64),
}
LOSS_SIDES = ("inside", "outside")


def _common(s: dict[str, int]) -> dict:
    return dict(
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        vocab_size=s["vocab"],
        max_position_embeddings=s["seq"],
        use_cache=False,
    )


def _decoder(config_class: str, model_class: str, kv: bool = True, **extra) -> Callable:
    """A transformers causal LM of ``model_class`` from ``config_class`` at a shape."""

    def make(s: dict[str, int]) -> nn.Module:
        import transformers

        transformers.logging.set_verbosity_error()
        fields = dict(_common(s), **extra)
        if kv:
            fields["num_key_value_heads"] = s["kv_heads"]
        config = getattr(transformers, config_class)(**fields, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        attention = "eager" if config_class == "Gemma2Config" else "sdpa"
        return getattr(transformers, model_class)._from_config(config, attn_implementation=attention)

    return make


def _t5(s: dict[str, int]) -> nn.Module:
    import transformers

    config = transformers.T5Config(
        d_model=s["hidden"], d_kv=s["hidden"] // s["heads"], d_ff=s["ffn"], num_layers=s["layers"],
        num_decoder_layers=s["layers"], num_heads=s["heads"], vocab_size=s["vocab"], dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=False,
    )
    return transformers.T5ForConditionalGeneration._from_config(config, attn_implementation="sdpa")


LANGUAGE_MODELS: dict[str, Callable[[dict[str, int]], nn.Module]] = {
    "qwen3": _decoder("Qwen3Config", "Qwen3ForCausalLM", head_dim=32, attention_dropout=0.0),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
    # Gemma 2: eager attention (its soft-capping is not in SDPA), final-logit soft-capping on
    "gemma2": _decoder("Gemma2Config", "Gemma2ForCausalLM", head_dim=32, attention_dropout=0.0),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM", attention_dropout=0.0),
    "gpt_neox": _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", kv=False, attention_dropout=0.0, hidden_dropout=0.0),
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM", attention_dropout=0.0),
    "t5": _t5,
}


class WithLoss(nn.Module):
    """A model and its loss as one module: what a user compiles to put the loss inside the graph."""

    def __init__(self, model: nn.Module, loss: Callable) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args):
        return self.loss(self.model(*args[:-1]), args[-1])


def _language(name: str, s: dict[str, int], loss_side: str) -> Workload:
    model = LANGUAGE_MODELS[name](s)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
    if loss_side == "inside":
        return Workload(model, kwargs=dict(input_ids=ids, labels=ids), loss=lambda out: out.loss)
    if name == "t5":  # the decoder's inputs as T5 derives them from labels, the loss over every label
        decoder_ids = model._shift_right(ids)
        return Workload(model, kwargs=dict(input_ids=ids, decoder_input_ids=decoder_ids),
                        loss=lambda out: F.cross_entropy(out.logits.reshape(-1, s["vocab"]), ids.reshape(-1)))
    # the very loss transformers runs for labels= (shift, fp32 upcast, ignore_index), here in eager
    return Workload(model, kwargs=dict(input_ids=ids),
                    loss=lambda out: model.loss_function(out.logits, ids, vocab_size=s["vocab"]))


def _vision(model: nn.Module, inputs: tuple, target: torch.Tensor, loss: Callable, loss_side: str) -> Workload:
    if loss_side == "inside":
        return Workload(WithLoss(model, loss), args=(*inputs, target), loss=lambda out: out)
    return Workload(model, args=inputs, loss=lambda out: loss(out, target))


def _classes(out, labels):
    return F.cross_entropy(getattr(out, "logits", out), labels)


def _denoise(out, noise):
    return F.mse_loss(out.sample, noise)


def _timm_vit(s: dict[str, int], loss_side: str) -> Workload:
    import timm  # needs torchvision built for the installed torch (the `zoo` extra's note)

    model = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=s["image"], patch_size=8,
                              embed_dim=s["hidden"], depth=s["layers"], num_heads=s["heads"], num_classes=10)
    x = torch.randn(s["batch"], 3, s["image"], s["image"])
    return _vision(model, (x,), torch.randint(0, 10, (s["batch"],)), _classes, loss_side)


def _torchvision_resnet(s: dict[str, int], loss_side: str) -> Workload:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(s["batch"], 3, s["image"], s["image"])
    return _vision(model, (x,), torch.randint(0, 10, (s["batch"],)), _classes, loss_side)


def _diffusers_unet(s: dict[str, int], loss_side: str) -> Workload:
    from diffusers import UNet2DModel

    model = UNet2DModel(sample_size=s["image"], in_channels=3, out_channels=3, block_out_channels=(32, 64),
                        layers_per_block=1, norm_num_groups=8, dropout=0.0,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    x = torch.randn(s["batch"], 3, s["image"], s["image"])
    steps = torch.randint(0, 1000, (s["batch"],))
    return _vision(model, (x, steps), torch.randn_like(x), _denoise, loss_side)


VISION_MODELS: dict[str, Callable[[dict[str, int], str], Workload]] = {
    "timm_vit": _timm_vit,
    "diffusers_unet": _diffusers_unet,
    "torchvision_resnet": _torchvision_resnet,
}
MODELS = (*LANGUAGE_MODELS, *VISION_MODELS)


def build(name: str, size: str, loss_side: str) -> Workload:
    """The workload of ``name`` at ``size`` with its loss on ``loss_side``; weights and inputs after
    ``torch.manual_seed(0)``, fp32, on the CPU."""
    if name not in MODELS or size not in SIZES or loss_side not in LOSS_SIDES:
        raise ValueError(f"unknown zoo row ({name!r}, {size!r}, {loss_side!r}); models {list(MODELS)}, sizes "
                         f"{list(SIZES)}, loss sides {list(LOSS_SIDES)}")
    torch.manual_seed(0)
    shape = SIZES[size]
    work = _language(name, shape, loss_side) if name in LANGUAGE_MODELS else VISION_MODELS[name](shape, loss_side)
    work.info.update(parameters=sum(p.numel() for p in work.model.parameters()), loss_side=loss_side,
                     shape=dict(shape))
    return work
