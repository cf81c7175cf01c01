"""A plain PyTorch DDP training script, written as a user would for SageMaker.

A tiny causal transformer LM trained on generated token sequences (no downloads), data-parallel
under torchrun (gloo on CPU). Rank 0 prints one line per step, `step N/M | loss L | lr R | T ms`,
and saves every `--save-steps` into `--output-dir` with `torch.save`: `ckpt-N/model.pt`,
`ckpt-N/optimizer.pt`, then `ckpt-N/DONE` last (a directory without it is an interrupted save).
At start every rank resumes from the newest complete `ckpt-N` it finds there. Seeded: the batch
of step N is the same whether or not the run was resumed. Its one brush with Aerie is the default
of `--output-dir`, as in hf_train.py: `/opt/ml/checkpoints` (SageMaker's) in a container, the
node's directory that Aerie exports as AERIE_CHECKPOINT_DIR on a local node.

    torchrun --nproc-per-node 2 examples/byo/ddp_train.py --output-dir ./checkpoints
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VOCAB, SEQ_LEN = 64, 32


class TinyLM(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(SEQ_LEN, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        return self.head(self.blocks(h, mask=mask, is_causal=True))


def batch(step: int, rank: int, size: int, seed: int) -> torch.Tensor:
    """Sequences a + b*i (mod VOCAB): learnable, and a function of (step, rank) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    a = torch.randint(0, VOCAB, (size, 1), generator=g)
    b = torch.randint(1, 4, (size, 1), generator=g)
    return (a + b * torch.arange(SEQ_LEN + 1)) % VOCAB


def latest_checkpoint(output_dir: str) -> int:
    """The newest step with a complete checkpoint in output_dir, 0 for none."""
    if not os.path.isdir(output_dir):
        return 0
    steps = [
        int(name.split("-")[1])
        for name in os.listdir(output_dir)
        if name.startswith("ckpt-") and os.path.exists(os.path.join(output_dir, name, "DONE"))
    ]
    return max(steps, default=0)


class SlowDisk(io.FileIO):
    """A file on slow storage (a network filesystem writing `rate` bytes/s): each write waits its
    time, so `torch.save` into it is slow the way a large state's save is."""

    def __init__(self, path: str, rate: float):
        super().__init__(path, "w")
        self.rate = rate

    def write(self, b) -> int:  # type: ignore[no-untyped-def]
        time.sleep(len(b) / self.rate)
        return super().write(b)


def state_bytes(*states: dict) -> int:
    """The tensor bytes in (nested) state dicts: what `torch.save` writes, less its framing."""

    def walk(x) -> int:  # type: ignore[no-untyped-def]
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, dict):
            return sum(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(walk(v) for v in x)
        return 0

    return sum(walk(s) for s in states)


def save_checkpoint(
    output_dir: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, keep: int, seconds: float = 0.0
) -> None:
    path = os.path.join(output_dir, f"ckpt-{step}")
    os.makedirs(path, exist_ok=True)
    states = {"model.pt": model.state_dict(), "optimizer.pt": optimizer.state_dict()}
    rate = state_bytes(*states.values()) / seconds if seconds else 0.0
    for name, state in states.items():
        if rate:
            with SlowDisk(os.path.join(path, name), rate) as f:
                torch.save(state, f)
        else:
            torch.save(state, os.path.join(path, name))
    with open(os.path.join(path, "DONE"), "w") as f:  # last: marks the checkpoint complete
        f.write(f"{step}\n")
    for s in sorted(int(n.split("-")[1]) for n in os.listdir(output_dir) if n.startswith("ckpt-"))[:-keep]:
        shutil.rmtree(os.path.join(output_dir, f"ckpt-{s}"), ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    # SageMaker's checkpoint directory; on a node that is no container, where Aerie put it instead.
    p.add_argument("--output-dir", default=os.environ.get("AERIE_CHECKPOINT_DIR", "/opt/ml/checkpoints"))
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept in --output-dir")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow each step down (seconds)")
    p.add_argument(
        "--save-seconds", type=float, default=0.0, help="each save takes about this long (storage this slow)"
    )
    p.add_argument("--quiet", action="store_true", help="print nothing: a loop that logs nowhere")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = latest_checkpoint(args.output_dir)
    if start:
        path = os.path.join(args.output_dir, f"ckpt-{start}")
        model.load_state_dict(torch.load(os.path.join(path, "model.pt")))
        optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt")))
        if rank == 0 and not args.quiet:
            print(f"resumed from {path}", flush=True)
    ddp = DistributedDataParallel(model)

    for step in range(start + 1, args.max_steps + 1):
        t0 = time.time()
        tokens = batch(step, rank, args.batch_size, args.seed)
        logits = ddp(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0:
            lr, ms = optimizer.param_groups[0]["lr"], (time.time() - t0) * 1000
            mean = mean_loss.item() / world
            if not args.quiet:
                print(f"step {step}/{args.max_steps} | loss {mean:.4f} | lr {lr:.2e} | {ms:.0f} ms", flush=True)
            if step % args.save_steps == 0 or step == args.max_steps:
                save_checkpoint(args.output_dir, step, model, optimizer, args.keep, args.save_seconds)

    dist.destroy_process_group()  # gloo aborts a process that exits with its group still up


if __name__ == "__main__":
    main()
