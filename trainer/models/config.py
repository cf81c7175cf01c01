"""Model shape, as one frozen dataclass shared by both families.

One config type (rather than one per family) keeps presets, checkpoints' config hashes, the
training loop and the Hugging Face export simple: the family picks the block, the other fields
are read only where they apply (`rotary_pct`/`use_parallel_residual` by GPT-NeoX,
`num_kv_heads`/`tie_embeddings`/`rope_theta` mostly by LLaMA).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["gpt_neox", "llama"]
FAMILIES: tuple[str, ...] = ("gpt_neox", "llama")


@dataclass(frozen=True)
class ModelConfig:
    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_seq_len: int
    num_kv_heads: int | None = None  # None means "as many as num_heads" (plain multi-head attention)
    rotary_pct: float = 1.0  # fraction of each head's dims that get rotary (Pythia: 0.25)
    rope_theta: float = 10000.0
    use_parallel_residual: bool = True  # GPT-NeoX only: x + attn(ln1(x)) + mlp(ln2(x))
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        if self.family == "gpt_neox" and self.kv_heads != self.num_heads:
            raise ValueError("gpt_neox has no grouped-query attention (num_kv_heads must equal num_heads)")
        if not 0.0 < self.rotary_pct <= 1.0:
            raise ValueError("rotary_pct must be in (0, 1]")
        if self.rotary_dim % 2:
            raise ValueError("the rotary part of a head must have an even number of dims")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def rotary_dim(self) -> int:
        """Dims per head that rotate; same rounding as Hugging Face's GPTNeoX (`int(head_dim * pct)`)."""
        return int(self.head_dim * self.rotary_pct)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Builds a config from a dict; unknown keys are an error so typos in a job spec surface."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)

    def replace(self, **overrides: Any) -> ModelConfig:
        return dataclasses.replace(self, **overrides)
