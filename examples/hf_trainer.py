"""fxremat under transformers' ``Trainer``: compile the model with ``model.compile(backend=...)`` before handing it
to the Trainer (docs/STACKS.md says why ``TrainingArguments(torch_compile_backend="fxremat")`` cannot work).

    python examples/hf_trainer.py            # a tiny Llama, a few steps, eager and compiled; losses and the report
"""

from __future__ import annotations

import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import fxremat


class Tokens(torch.utils.data.Dataset):
    def __init__(self, rows: int = 8, length: int = 16, vocab: int = 64) -> None:
        self.ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def train(model: torch.nn.Module, steps: int = 3, **arguments) -> list[float]:
    """The Trainer's logged loss at each of ``steps`` steps; ``arguments``: more ``TrainingArguments``."""
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=4,
            max_steps=steps,
            logging_steps=1,
            learning_rate=1e-2,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
            **arguments,
        )
        trainer = Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def main() -> None:
    print("eager   ", train(tiny_llama()))
    backend = fxremat.backend(memory_budget=0.5)
    model = tiny_llama()
    model.compile(backend=backend)  # in place: the Trainer still sees LlamaForCausalLM.forward's signature
    print("fxremat ", train(model))
    print(fxremat.format_text(backend.reports[0]))


if __name__ == "__main__":
    main()
