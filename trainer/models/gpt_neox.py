"""GPT-NeoX / Pythia (Black et al. 2022; Biderman et al. 2023), as Hugging Face's GPTNeoX:
LayerNorm, partial rotary (`rotary_pct`), exact GELU MLP, biases everywhere, untied embeddings,
and the parallel residual x + attn(ln1(x)) + mlp(ln2(x)) (or the sequential one)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.attention import Attention
from trainer.models.config import ModelConfig
from trainer.models.decoder import DecoderLM


class GeluMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.w_in = nn.Linear(hidden_size, intermediate_size)
        self.w_out = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(F.gelu(self.w_in(x)))


class GPTNeoXBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.parallel_residual = cfg.use_parallel_residual
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.head_dim, bias=True)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = GeluMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn_out = self.attn(self.attn_norm(x), cos, sin)
        if self.parallel_residual:
            return x + attn_out + self.mlp(self.mlp_norm(x))
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h))


class GPTNeoX(DecoderLM):
    def __init__(self, cfg: ModelConfig):
        assert cfg.family == "gpt_neox"
        blocks = [GPTNeoXBlock(cfg) for _ in range(cfg.num_layers)]
        super().__init__(cfg, blocks, nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps))
