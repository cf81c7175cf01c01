"""What both families share: token embedding, a stack of blocks, final norm, output head, RoPE
tables, and deterministic initialisation. A family supplies its block and its norm."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.models.config import ModelConfig
from trainer.models.loss import linear_cross_entropy
from trainer.models.rope import rope_tables, signed_sin


class DecoderLM(nn.Module):
    """`forward(input_ids[B, T]) -> float32 logits[B, T, V]`; blocks live in `self.layers`."""

    def __init__(self, cfg: ModelConfig, blocks: list[nn.Module], final_norm: nn.Module):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(blocks)
        self.norm = final_norm
        # With tied embeddings the output head reuses `embed.weight` and has no parameter of its
        # own, so the state dict (and a checkpoint) holds the table once.
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Not persistent: recomputed by init_weights (also after building on the meta device).
        self.register_buffer("rope_cos", torch.empty(cfg.max_seq_len, cfg.rotary_dim), persistent=False)
        # sin with the sign of rotate-half folded in (`trainer.models.rope.signed_sin`).
        self.register_buffer("rope_sin", torch.empty(cfg.max_seq_len, cfg.rotary_dim), persistent=False)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] in float32; or, given `labels` [B, T], the mean cross-entropy loss
        computed chunk by chunk without materialising the logits (`trainer.models.loss`).
        Labels equal to -100 are ignored."""
        seq = input_ids.shape[1]
        if seq > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:seq, None], self.rope_sin[:seq, None]  # [T, 1, rotary_dim]
        h = self.embed(input_ids)
        for block in self.layers:
            h = block(h, cos, sin)
        h = self.norm(h)
        weight = self.embed.weight if self.output is None else self.output.weight
        if labels is not None:
            return linear_cross_entropy(h.flatten(0, 1), weight, labels.flatten())
        return torch.nn.functional.linear(h, weight).float()

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Re-initialises every parameter and the RoPE tables.

        Linear and embedding weights ~ N(0, init_std); the projections that write into the
        residual stream (attention output, MLP output) get init_std / sqrt(2 * num_layers), as in
        GPT-2 and Megatron-LM, so the residual's variance does not grow with depth. Biases are
        zero, norms are identity. With `seed`, the result depends on the seed only (the caller's
        RNG state is left untouched).
        """
        if seed is None:
            self._init_all()
            return
        device = self.embed.weight.device
        cuda = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            self._init_all()

    def _init_all(self) -> None:
        cfg = self.cfg
        cos, sin = rope_tables(cfg.rotary_dim, cfg.max_seq_len, cfg.rope_theta, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(signed_sin(sin))
        residual_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=cfg.init_std)
            elif isinstance(module, nn.Linear):
                is_residual_out = name.endswith(("attn.wo", "mlp.w_out", "mlp.w_down"))
                nn.init.normal_(module.weight, std=residual_std if is_residual_out else cfg.init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif hasattr(module, "reset_parameters") and module is not self:
                module.reset_parameters()  # LayerNorm / RMSNorm: weight 1, bias 0
