"""The loss-side peak (issue #55, docs/DESIGN.md §14): a Llama-style model whose step peaks at its loss, one setting
per process, under real Inductor on CPU.

    python benchmarks/loss_peak.py SETTING [--model llama|qwen3|gpt2] [--vocab V] [--hidden H] [--layers L]
        [--tokens T] [--logits] [--json PATH]
        # SETTING: eager, inductor (Inductor's default partitioner), inductor_chunker (the same with Inductor's
        #          auto-chunker on: ``auto_chunker.enable``), default (fxremat: chunks under a budget only),
        #          auto (loss_chunks="auto": the chunks chosen), nochunk (fxremat, loss_chunks=0), kN (fxremat
        #          loss_chunks=N), pbX (fxremat peak_budget=X; X > 1: bytes)

A transformers causal LM from its config (random weights, fp32, one thread), ``labels=`` given, the compiled function
returning the loss alone (``--logits``: the loss and the logits, as ``model(x, labels=y)`` returns them; the step
backpropagates the loss and drops the logits, as transformers' Trainer does, so the logits' gradient is autograd's
zero tensor): ``llama`` (``LlamaForCausalLM``; by default vocabulary 65,536, hidden 256, 2 layers, 1 x 1,024
tokens), ``qwen3`` (``Qwen3ForCausalLM``, vocabulary 151,936 unless ``--vocab``), ``gpt2`` (``GPT2LMHeadModel`` at
124M, 1 x 512 tokens unless ``--tokens``; its head tied to the embedding).  Gradients of
the first step against an eager copy (``grad_rule.relative_errors``), two warm-up steps, then one step's peak above
what it starts with (CPU profiler memory events, ``fxremat.measure``), the parameters' gradients set to None before
it (so the step allocates them, as a training step after ``zero_grad`` does).  Prints one JSON line: measured and
simulated peak bytes, the loss regions, each chunk count tried with its simulated peak, the floor, the worst gradient
error, the first step's seconds (its compile, in an empty Inductor cache); ``--json PATH`` also appends it to PATH's
``rows`` (the results generator's input).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def backend_of(setting: str):
    import fxremat

    if setting in ("eager", "inductor"):
        return setting
    if setting == "inductor_chunker":  # Inductor's default partitioner with its own auto-chunker on (this process)
        import torch._inductor.config as inductor_config

        inductor_config.auto_chunker.enable = True
        return "inductor"
    if setting == "default":
        return fxremat.backend(compare_default=False)
    if setting == "auto":
        return fxremat.backend(compare_default=False, loss_chunks="auto")
    if setting == "nochunk":
        return fxremat.backend(compare_default=False, loss_chunks=0)
    if setting.startswith("k"):
        return fxremat.backend(compare_default=False, loss_chunks=int(setting[1:]))
    if setting.startswith("pb"):
        value = float(setting[2:])
        return fxremat.backend(compare_default=False, peak_budget=value if value <= 1 else int(value))
    raise SystemExit(f"unknown setting {setting!r}: eager, inductor, inductor_chunker, default, auto, nochunk, kN, pbX")


class LossOnly(torch.nn.Module):
    """The model with ``labels=``, returning the loss alone (the logits are not a graph output)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


class LossAndLogits(LossOnly):
    """The model with ``labels=``, returning the loss and the logits (a graph output beside the loss)."""

    def forward(self, ids):
        out = self.model(input_ids=ids, labels=ids)
        return out.loss, out.logits


def _loss(out):
    """The step's loss: the loss alone, or the loss of the (loss, logits) pair, the logits dropped."""
    return out[0] if isinstance(out, tuple) else out


def build(model: str, vocab: int, hidden: int, layers: int, tokens: int, logits: bool = False):
    import transformers as t

    torch.manual_seed(0)
    if model == "gpt2":
        config = t.GPT2Config(
            vocab_size=vocab,
            n_positions=max(1024, tokens),
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
        )
        net = t.GPT2LMHeadModel(config)
        # transformers names a loss from the class name; GPT2LMHeadModel matches none, so its ``loss_function``
        # logs a warning on every call, and Dynamo breaks the graph there: the logits and the loss land in two
        # graphs and no loss region exists (docs/DESIGN.md §14).  Naming the loss keeps them in one graph.
        net.loss_type = "ForCausalLM"
    else:
        kind = t.Qwen3Config if model == "qwen3" else t.LlamaConfig
        config = kind(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=max(1, hidden // 64),
            num_key_value_heads=max(1, hidden // 64),
            head_dim=64 if hidden >= 64 else hidden,
            vocab_size=vocab,
            max_position_embeddings=tokens,
            attention_dropout=0.0,
            use_cache=False,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            tie_word_embeddings=False,
        )
        net = (t.Qwen3ForCausalLM if model == "qwen3" else t.LlamaForCausalLM)(config)
    ids = torch.randint(0, vocab, (1, tokens))
    return (LossAndLogits if logits else LossOnly)(net), ids


def row(setting: str, model_name: str, vocab: int, hidden: int, layers: int, tokens: int, logits: bool = False) -> dict:
    import grad_rule

    from fxremat.measure import step_peak_bytes

    torch.set_num_threads(1)
    model, ids = build(model_name, vocab, hidden, layers, tokens, logits)
    reference = copy.deepcopy(model)
    _loss(reference(ids)).backward()
    expected = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    backend = backend_of(setting)
    compiled = model if setting == "eager" else torch.compile(model, backend=backend)

    def step():
        _loss(compiled(ids)).backward()

    start = time.perf_counter()
    step()
    first_step = time.perf_counter() - start
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    errors, _ = grad_rule.relative_errors(grads, expected)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)
    peak, _ = step_peak_bytes(step, "cpu")
    reports = getattr(backend, "reports", [])
    return dict(
        setting=setting,
        model=model_name,
        shape=dict(vocab=vocab, hidden=hidden, layers=layers, tokens=tokens),
        logits_returned=logits,
        measured=peak,
        simulated=sum(r.simulated_peak_bytes or 0 for r in reports) if reports else None,
        loss_regions=[list(row) for r in reports for row in r.loss_regions],
        loss_chunks_tried=[list(t) for r in reports for t in r.loss_chunks_tried],
        floor=sum(r.loss_peak_floor_bytes or 0 for r in reports) if reports else None,
        grad=max(errors.values()) if errors else 0.0,
        first_step_seconds=round(first_step, 1),
    )


DEFAULTS = {"llama": (65536, 1024), "qwen3": (151936, 1024), "gpt2": (50257, 512)}  # vocabulary, tokens


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("setting")
    parser.add_argument("--model", choices=sorted(DEFAULTS), default="llama")
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--logits", action="store_true", help="the compiled function returns the loss and the logits")
    parser.add_argument("--json", type=Path, help="append the row to this file's rows")
    args = parser.parse_args(argv)
    vocab, tokens = DEFAULTS[args.model]
    from fxremat_passes import _torch_private as tp

    with tp.fresh_inductor_cache():  # the first step's compile, cold: no kernel another row compiled
        shape = (args.vocab or vocab, args.hidden, args.layers, args.tokens or tokens)
        result = row(args.setting, args.model, *shape, logits=args.logits)
    print(json.dumps(result))
    if args.json is not None:
        data = json.loads(args.json.read_text()) if args.json.exists() else {"rows": []}
        data["rows"].append(result)
        args.json.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
