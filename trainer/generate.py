"""Sampling text from a model: what the eval loop shows people while a job trains.

`generate` works on any model with our forward contract (`input_ids[B, T] -> logits[B, T, V]`).
Each prompt is decoded on its own (our models take no padding mask, and an eval has a handful of
prompts), re-running the model over the context each step: no KV cache, which keeps the model
code free of inference-only state and is quick enough for the prompts and sizes an eval uses.
Under FSDP every rank must call it with the same prompts and seed (forward is collective); the
sampled tokens then agree across ranks because the generator is seeded identically.

Also runnable on an exported Hugging Face directory (see `trainer.export`):

    python -m trainer.generate MODEL_DIR --prompt "def main(" --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn


class TextTokenizer(Protocol):
    eod_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator) -> int:
    """One token id from the last position's logits [V]: argmax at temperature 0, else top-k sampling."""
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters())
    local = getattr(param, "to_local", None)  # an FSDP2 DTensor lives on its mesh's device
    return local().device if local is not None else param.device


@torch.inference_mode()
def generate(
    model: nn.Module,
    tokenizer: TextTokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
) -> list[str]:
    """The continuation of each prompt (without the prompt), stopping early at end-of-document.

    `temperature == 0` decodes greedily; otherwise sampling from the `top_k` most likely tokens is
    reproducible for a given `seed`. The model's train/eval mode is restored afterwards.
    """
    device = _model_device(model)
    max_context = getattr(getattr(model, "cfg", None), "max_seq_len", None)
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        completions = []
        for prompt in prompts:
            ids = tokenizer.encode(prompt)
            if not ids:  # an empty prompt starts a new document
                if tokenizer.eod_id is None:
                    raise ValueError("empty prompt and the tokenizer has no end-of-document token")
                ids = [tokenizer.eod_id]
            context = torch.tensor([ids], dtype=torch.long, device=device)
            new: list[int] = []
            for _ in range(max_new_tokens):
                window = context if max_context is None else context[:, -max_context:]
                logits = model(window)[0, -1].float()
                token = _next_token(logits, temperature, top_k, gen)
                if token == tokenizer.eod_id:
                    break
                new.append(token)
                context = torch.cat([context, context.new_tensor([[token]])], dim=1)
            completions.append(tokenizer.decode(new))
        return completions
    finally:
        model.train(was_training)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sample text from a Hugging Face GPT-NeoX/LLaMA directory.")
    parser.add_argument("model_dir")
    parser.add_argument("--prompt", action="append", required=True)
    parser.add_argument("--tokenizer", help="tokenizer.json or directory (default: the model directory)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from trainer.data import load_tokenizer
    from trainer.export import import_hf
    from trainer.models import build_model

    cfg, state_dict = import_hf(args.model_dir)
    model = build_model(cfg)
    model.load_state_dict({k: v.float() for k, v in state_dict.items()})
    tokenizer = load_tokenizer(args.tokenizer or args.model_dir)
    outputs = generate(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    for prompt, text in zip(args.prompt, outputs):
        print(json.dumps({"prompt": prompt, "completion": text}))


if __name__ == "__main__":
    main()
