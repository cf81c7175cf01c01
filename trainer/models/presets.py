"""Named model shapes, as published.

Pythia shapes and vocab sizes are those of the EleutherAI/pythia-* Hugging Face configs (the
vocabulary is padded to 50304, 50432 for 6.9b); GPT-NeoX-20B, Llama 2 7B and Llama 3 8B follow
their released configs. The tiny presets train in seconds on a CPU and are what tests use.
"""

from __future__ import annotations

from typing import Any

from trainer.models.config import ModelConfig


def _pythia(hidden: int, layers: int, heads: int, vocab: int = 50304) -> ModelConfig:
    return ModelConfig(
        family="gpt_neox",
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=4 * hidden,
        max_seq_len=2048,
        rotary_pct=0.25,
        rope_theta=10000.0,
        use_parallel_residual=True,
        tie_embeddings=False,
        norm_eps=1e-5,
    )


PRESETS: dict[str, ModelConfig] = {
    "pythia-70m": _pythia(512, 6, 8),
    "pythia-160m": _pythia(768, 12, 12),
    "pythia-410m": _pythia(1024, 24, 16),
    "pythia-1b": _pythia(2048, 16, 8),
    "pythia-1.4b": _pythia(2048, 24, 16),
    "pythia-2.8b": _pythia(2560, 32, 32),
    "pythia-6.9b": _pythia(4096, 32, 32, vocab=50432),
    "gpt-neox-20b": ModelConfig(
        family="gpt_neox",
        vocab_size=50432,
        hidden_size=6144,
        num_layers=44,
        num_heads=64,
        intermediate_size=24576,
        max_seq_len=2048,
        rotary_pct=0.25,
        use_parallel_residual=True,
    ),
    "llama-2-7b": ModelConfig(
        family="llama",
        vocab_size=32000,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        intermediate_size=11008,
        max_seq_len=4096,
        rope_theta=10000.0,
        tie_embeddings=False,
        norm_eps=1e-5,
    ),
    "llama-3-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
        tie_embeddings=False,
        norm_eps=1e-5,
    ),
    # Tiny shapes for tests and the demo: a few hundred thousand parameters.
    "pythia-tiny": ModelConfig(
        family="gpt_neox",
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=256,
        max_seq_len=256,
        rotary_pct=0.25,
        use_parallel_residual=True,
    ),
    "llama-tiny": ModelConfig(
        family="llama",
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=176,
        max_seq_len=256,
        rope_theta=10000.0,
    ),
}

# Parameter counts as published: Pythia's exact totals (the Pythia paper's / model cards' table);
# for the others the rounded figures their authors give (GPT-NeoX-20B paper: 20.55B; Llama 2 7B:
# 6.74B; Llama 3 8B: 8.03B). Tests hold `num_params` to 1 % of these.
PUBLISHED_PARAMS: dict[str, int] = {
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "gpt-neox-20b": 20_550_000_000,
    "llama-2-7b": 6_740_000_000,
    "llama-3-8b": 8_030_000_000,
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, with fields overridden (e.g. `vocab_size=` to match a trained tokenizer)."""
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
    return cfg.replace(**overrides) if overrides else cfg
