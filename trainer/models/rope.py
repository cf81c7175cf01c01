"""Rotary position embedding in the "rotate half" convention of GPT-NeoX and Hugging Face.

Each rotating head vector is split in two halves (x1, x2) that rotate as pairs (x1[i], x2[i]),
rather than Meta's interleaved pairs (x[2i], x[2i+1]). Using the Hugging Face convention means
our q/k projection weights are byte-for-byte those of `GPTNeoXForCausalLM`/`LlamaForCausalLM`:
export and import need no per-head permutation of q and k.
Only the first `rotary_dim` dims of a head rotate (GPT-NeoX's `rotary_pct`); the rest pass through.

Hugging Face computes `x * cos + cat(-x2, x1) * sin` (chunk, neg, cat, then the products). Here
the sign lives in the table instead (`signed_sin` = cat(-sin1, sin2)) and the halves swap with
one `roll`: `x * cos + cat(x2, x1) * signed_sin`, the same numbers bit for bit (negation is exact)
in fewer, cheaper ops, and the attention applies it to q and k together in one call.
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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: the sign of `rotate_half` folded into the table."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotates x [B, T, heads, head_dim] by position; cos/sin_signed are [T, rotary_dim] or
    [T, 1, rotary_dim] (`signed_sin` of the sin table)."""
    rotary_dim = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin_signed = cos[:, None, :], sin_signed[:, None, :]  # broadcast over heads
    cos, sin_signed = cos.to(x.dtype), sin_signed.to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return x * cos + x.roll(rotary_dim // 2, -1) * sin_signed
    # split, not slicing: its backward is one cat, where each slice's would zero-fill a full-size gradient.
    x_rot, x_pass = x.split([rotary_dim, x.shape[-1] - rotary_dim], dim=-1)
    return torch.cat((x_rot * cos + x_rot.roll(rotary_dim // 2, -1) * sin_signed, x_pass), dim=-1)
