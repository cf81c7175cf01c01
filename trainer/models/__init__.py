"""GPT-NeoX/Pythia and LLaMA in plain PyTorch.

The interface the training loop, metrics and export rely on:

- `ModelConfig` (frozen dataclass, `to_dict`/`from_dict`), `PRESETS`, `get_preset(name, **overrides)`
- `build_model(cfg) -> nn.Module`: `forward(input_ids: LongTensor[B, T]) -> FloatTensor[B, T, V]`
  (float32 logits, also under bf16 autocast), or `forward(input_ids, labels=labels[B, T])` ->
  the mean cross-entropy as a float32 scalar, computed without materialising the logits
  (`trainer.models.loss`; faster and far smaller for big vocabularies; labels of -100 are
  ignored); the transformer blocks are `model.layers`
  (an `nn.ModuleList`, the unit of FSDP2 `fully_shard` and activation checkpointing);
  `model.init_weights(seed=None)` re-initialises every parameter deterministically.
  Models are built on whatever device is current (use `torch.device("meta")` as a context for
  big ones, then `model.to_empty(device=...)` and `model.init_weights()`).
- `num_params(cfg)`, `flops_per_token(cfg, seq_len)` (6·N + 12·L·H·Q·T, see `accounting`);
  `PUBLISHED_PARAMS` (the figures the presets are checked against).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.models.accounting import flops_per_token, num_matmul_params, num_params
from trainer.models.config import ModelConfig
from trainer.models.presets import PRESETS, PUBLISHED_PARAMS, get_preset

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "PRESETS",
    "PUBLISHED_PARAMS",
    "ModelConfig",
    "build_model",
    "flops_per_token",
    "get_preset",
    "num_matmul_params",
    "num_params",
]


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model for `cfg.family`, with weights initialised (`init_std`, seed from torch's RNG)."""
    if cfg.family == "gpt_neox":
        from trainer.models.gpt_neox import GPTNeoX

        return GPTNeoX(cfg)
    if cfg.family == "llama":
        from trainer.models.llama import Llama

        return Llama(cfg)
    raise ValueError(f"unknown model family {cfg.family!r}")
