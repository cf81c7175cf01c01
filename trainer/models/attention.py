"""Causal self-attention shared by both families: one fused QKV projection, RoPE, SDPA.

The fused projection's output rows are [all q heads | all k heads | all v heads], so one matmul
serves q, k and v and grouped-query attention is just fewer k/v rows. (Hugging Face's GPT-NeoX
interleaves q, k, v per head instead; `trainer.export` converts between the two layouts.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.wqkv = nn.Linear(hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.wo = nn.Linear(self.q_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden]; cos/sin_signed [T, 1, rotary_dim] (see `trainer.models.rope`)."""
        batch, seq, _ = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.wqkv(x).view(batch, seq, heads + 2 * kv_heads, self.head_dim)
        # q and k heads are adjacent in the fused output: one RoPE call rotates both. (split, not
        # slicing: its backward is one cat, where each slice's would zero-fill a full-size gradient.)
        qk, v = qkv.split([heads + kv_heads, kv_heads], dim=2)
        q, k = apply_rope(qk, cos, sin_signed).split([heads, kv_heads], dim=2)
        # SDPA wants [B, heads, T, head_dim]; its fused kernels take the transposed views as they
        # are, and its output is laid out as [B, T, heads, head_dim], so the reshape is a view.
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=kv_heads != heads,
        )
        return self.wo(out.transpose(1, 2).reshape(batch, seq, self.q_size))
