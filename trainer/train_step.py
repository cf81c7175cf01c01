"""One training step's compute: the learning-rate schedule, the optimizer, the loss, the step itself
(gradient accumulation, clipping, AdamW, schedule) and the evaluation loss.

Apart from the loop (trainer/train.py) so that the bench times the very step the loop runs
(`bench/trainer_vs_hf.py`) and the tests check it without a run (`trainer.train.train_step` still names it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer import parallel
from trainer.config import TrainConfig
from trainer.data.build import micro_batches

# --- learning-rate schedule --------------------------------------------------------------------


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (0-based): linear warmup to `lr`, cosine decay to `min_lr` at `steps`."""
    if cfg.warmup > 0 and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    decay_steps = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / decay_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig):
    """AdamW without weight decay on biases and norm weights (1-D parameters).

    The fused implementation (one kernel per parameter group and step, on CPU and GPU, also for
    FSDP2's DTensor parameters): on CPU it is several times faster than `foreach`, which runs one
    pass over all the parameters per elementwise op of the update."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, cfg) / cfg.lr)
    return optimizer, scheduler


# --- model ---------------------------------------------------------------------------------------


def build_model_config(cfg: TrainConfig):
    from trainer.models import get_preset

    return get_preset(cfg.model.preset, **cfg.model.overrides)


def loss_of(model, tokens: torch.Tensor, world: parallel.World, precision: str = "auto") -> torch.Tensor:
    """Mean next-token cross-entropy of a [B, T + 1] batch. The model computes it itself
    (`model(inputs, labels=labels)`): output projection and cross-entropy fused chunk by chunk,
    without materialising the [B·T, vocab] logits (`trainer.models.loss`); the same value as
    `F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())`, faster and smaller."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    with parallel.autocast(world, precision):
        return model(inputs, labels=labels)


def total_grad_norm(model, max_norm: float) -> torch.Tensor:
    """Clip (when `max_norm` > 0) and return the global norm before clipping, as a plain tensor."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def train_step(
    model,
    optimizer,
    scheduler,
    batches: Iterator[torch.Tensor],
    world: parallel.World,
    cfg: TrainConfig,
    poison_loss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step: `grad_accum` micro-batches from `batches` (gradients synchronised on
    the last only), clipping, AdamW, schedule. Returns (mean loss, grad norm before clipping),
    both as tensors. `poison_loss` turns the loss into NaN (fault injection). This is all the
    compute of a training step; `bench/trainer_vs_hf.py` times this very function."""
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=world.device)
    for micro in range(cfg.grad_accum):
        batch = next(batches)
        with parallel.gradient_sync(model, enabled=micro == cfg.grad_accum - 1):
            loss = loss_of(model, batch, world, cfg.precision)
            if poison_loss:
                loss = loss * float("nan")
            (loss / cfg.grad_accum).backward()
        loss_sum += loss.detach()
    grad_norm = total_grad_norm(model, cfg.clip)
    optimizer.step()
    scheduler.step()
    return loss_sum / cfg.grad_accum, grad_norm


@torch.no_grad()
def evaluate(model, dataset, world: parallel.World, cfg: TrainConfig) -> float:
    """Mean loss over a fixed set of batches (the same every evaluation; see TrainConfig.eval_iters)."""
    from trainer.data import MegatronPretrainingSampler

    model.eval()
    sampler = MegatronPretrainingSampler(len(dataset), 0, cfg.micro_batch_size, world.rank, world.world_size)
    total = torch.zeros(2, device=world.device)
    for tokens in micro_batches(dataset, sampler, world.device, cfg.data.read_ahead_mb):
        total += torch.stack(
            [loss_of(model, tokens, world, cfg.precision).detach(), torch.ones((), device=world.device)]
        )
    dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()
