"""Training tokens/s of our models vs Hugging Face transformers on the same config (CPU).

For each family (GPT-NeoX vs `GPTNeoXForCausalLM`, LLaMA-GQA vs `LlamaForCausalLM`):

- the same shapes (HF's model is built from `trainer.export.to_hf_config`), the same weights
  (ours are loaded from HF's randomly initialised state dict, and the bench checks that the
  first losses agree), the same batch of tokens, the same optimizer: `torch.optim.AdamW(fused=True)`,
  the default of transformers' own Trainer on torch >= 2.8;
- HF runs with `attn_implementation="sdpa"` (its default, and its fastest attention on CPU);
- "ours" computes the loss as the training loop does (logits, then `F.cross_entropy`, the very
  code HF's model is timed with); "ours_fused_loss" uses `model(inputs, labels=labels)`, which
  fuses the output projection with the cross-entropy (`trainer.models.loss`);
- after warm-up steps, timed rounds rotate between the variants (so load from other processes
  hits all alike) and the median round gives tokens/s.

Prints ONE JSON line: tokens/s of each and ratio = ours / hf (goal >= 1.3); `*_cpu_time` ratios
compare CPU seconds per token instead, which holds up better on a machine shared with other work.
`--compile` also times every variant under `torch.compile` (inductor; optional, slow to build).

    python bench/trainer_vs_hf.py [--rounds 5] [--steps 3] [--threads 2] [--compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.export import from_hf_state_dict, to_hf_config  # noqa: E402
from trainer.models import ModelConfig, build_model, get_preset  # noqa: E402

SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, vocab_size=8192)
CONFIGS = {
    "gpt_neox": get_preset("pythia-tiny", **SHAPE, intermediate_size=1024),
    "llama": get_preset("llama-tiny", **SHAPE, num_kv_heads=2, intermediate_size=688),
}


def hf_model(cfg: ModelConfig):
    import transformers

    hf_cfg = to_hf_config(cfg)
    hf_cfg.pop("architectures")
    config = transformers.AutoConfig.for_model(**hf_cfg)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def logits_loss(logits_of):
    """The training loop's loss (`trainer.train.loss_of`): logits, then cross-entropy."""
    def loss(inputs, labels):
        return F.cross_entropy(logits_of(inputs).float().flatten(0, 1), labels.flatten())
    return loss


class Runner:
    """One model + optimizer; `step()` is one full training step on the fixed batch."""

    def __init__(self, model, loss_fn, tokens: torch.Tensor, compile_model: bool):
        self.model = model.train()
        self.loss_fn = torch.compile(loss_fn) if compile_model else loss_fn
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        self.inputs, self.labels = tokens[:, :-1], tokens[:, 1:]
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # this process's CPU seconds: less sensitive to other load

    def step(self) -> float:
        loss = self.loss_fn(self.inputs, self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def timed(self, steps: int) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.step()
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu_start)


def compare(cfg: ModelConfig, args) -> dict:
    """tokens/s of each variant; every variant starts from the same weights (HF's random init)."""
    torch.manual_seed(0)
    hf = hf_model(cfg)
    initial = from_hf_state_dict(hf.state_dict(), cfg)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))

    def ours_model():
        model = build_model(cfg)
        model.load_state_dict(initial)
        return model

    ours, ours_fused = ours_model(), ours_model()
    runners = {
        "hf": Runner(hf, logits_loss(lambda ids: hf(input_ids=ids).logits), tokens, args.compile),
        "ours": Runner(ours, logits_loss(ours), tokens, args.compile),
        # Output projection + cross-entropy in one chunked pass (`model(inputs, labels=labels)`).
        "ours_fused_loss": Runner(ours_fused, ours_fused, tokens, args.compile),
    }
    first = {name: r.step() for name, r in runners.items()}
    if max(first.values()) - min(first.values()) > 1e-4:
        raise SystemExit(f"not the same model: first losses differ {first}")
    for r in runners.values():
        for _ in range(args.warmup):
            r.step()
    for i in range(args.rounds):
        order = list(runners.values())
        order = order[i % len(order):] + order[:i % len(order)]  # rotate who goes first
        for r in order:
            r.timed(args.steps)
    tokens_per_round = args.batch * args.seq * args.steps
    rate = {n: tokens_per_round / statistics.median(r.times) for n, r in runners.items()}
    cpu_rate = {n: tokens_per_round / statistics.median(r.cpu_times) for n, r in runners.items()}
    return {
        "hf_tokens_per_s": round(rate["hf"], 1),
        "ours_tokens_per_s": round(rate["ours"], 1),
        "ours_fused_loss_tokens_per_s": round(rate["ours_fused_loss"], 1),
        "ratio": round(rate["ours"] / rate["hf"], 3),
        "ratio_fused_loss": round(rate["ours_fused_loss"] / rate["hf"], 3),
        # The same ratios from CPU seconds (tokens per CPU-second), for a machine shared with others.
        "ratio_cpu_time": round(cpu_rate["ours"] / cpu_rate["hf"], 3),
        "ratio_fused_loss_cpu_time": round(cpu_rate["ours_fused_loss"] / cpu_rate["hf"], 3),
        "first_loss": round(first["ours"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--family", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--compile", action="store_true", help="also time both under torch.compile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    result: dict = {
        "bench": "trainer_vs_hf", "device": "cpu", "threads": args.threads, "batch": args.batch,
        "seq_len": args.seq, "shape": SHAPE, "optimizer": "AdamW(fused=True)",
        "torch": torch.__version__, "transformers": transformers.__version__, "goal_ratio": 1.3,
    }
    compile_modes = [False, True] if args.compile else [False]
    for family in args.family or sorted(CONFIGS):
        for compiled in compile_modes:
            args.compile = compiled
            key = family + ("_compiled" if compiled else "")
            result[key] = compare(CONFIGS[family], args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
