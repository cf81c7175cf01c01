"""Parameter and FLOP counts from the config alone (no model is built).

`flops_per_token` is what MFU is measured against, so it follows the formula published MFU
figures use (PaLM, Appendix B; Megatron-LM and torchtitan use the same):

    flops_per_token = 6 * N + 12 * L * H * Q * T

- N: parameters that take part in a matrix multiply: every parameter except the input
  embedding table, which is a lookup (when embeddings are tied the shared table is counted once,
  as the output projection).
- 6 = 2 (multiply-add) x 3 (forward, plus backward for activations and for weights).
- 12 * L * H * Q * T: the attention scores (Q K^T) and the weighted sum (A V), each 2*T*H*Q
  FLOPs per token and layer forward, times 3 for training; H*Q = hidden_size. T is the sequence
  length. Like PaLM it counts the full T x T score matrix, not half of it for the causal mask, so
  our MFU is comparable with theirs.
"""

from __future__ import annotations

from trainer.models.config import ModelConfig


def num_params(cfg: ModelConfig) -> int:
    """Exact parameter count of `build_model(cfg)` (tested against `sum(p.numel())`)."""
    d, v, i = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    embeddings = v * d * (1 if cfg.tie_embeddings else 2)
    if cfg.family == "gpt_neox":
        norms = 2 * (2 * d)  # two LayerNorms, weight + bias
        attn = d * (q_dim + 2 * kv_dim) + (q_dim + 2 * kv_dim) + q_dim * d + d
        mlp = d * i + i + i * d + d
        final_norm = 2 * d
    else:
        norms = 2 * d  # two RMSNorms, weight only
        attn = d * (q_dim + 2 * kv_dim) + q_dim * d
        mlp = 3 * d * i
        final_norm = d
    return embeddings + cfg.num_layers * (norms + attn + mlp) + final_norm


def num_matmul_params(cfg: ModelConfig) -> int:
    """N of the FLOP formula: all parameters except the input embedding lookup table."""
    lookup = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size
    return num_params(cfg) - lookup


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) at sequence length `seq_len`; see module doc."""
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    return 6 * num_matmul_params(cfg) + attention
