"""Rotary position embedding in the "rotate half" convention of GPT-NeoX and Hugging Face.

Each rotating head vector is split in two halves (x1, x2) that rotate as pairs (x1[i], x2[i]),
rather than Meta's interleaved pairs (x[2i], x[2i+1]). Using the Hugging Face convention means
our q/k projection weights are byte-for-byte those of `GPTNeoXForCausalLM`/`LlamaForCausalLM`:
export and import need no per-head permutation of q and k.
Only the first `rotary_dim` dims of a head rotate (GPT-NeoX's `rotary_pct`); the rest pass through.
"""

from __future__ import annotations

import torch


def rope_tables(rotary_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each float32 [max_seq_len, rotary_dim], computed exactly as Hugging Face does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim))
    positions = torch.arange(max_seq_len, dtype=torch.float, device=device)
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x [B, T, heads, head_dim] by position; cos/sin are [T, rotary_dim]."""
    rotary_dim = cos.shape[-1]
    cos = cos[:, None, :].to(x.dtype)  # broadcast over heads
    sin = sin[:, None, :].to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)
