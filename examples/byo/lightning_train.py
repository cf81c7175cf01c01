"""A typical PyTorch Lightning script, written as a user would, with nothing of Aerie in it.

A tiny regression model on generated data, Lightning's default progress bar (Rich when `rich` is
installed, tqdm otherwise) and default logger, and `trainer.fit(..., ckpt_path="last")`, which
resumes from `last.ckpt` in the checkpoint directory when there is one. Without
`--checkpoint-dir` the default `ModelCheckpoint` saves `epoch=E-step=S.ckpt` at each epoch's end
under `<root-dir>/lightning_logs/version_N/checkpoints/`; with it, into that directory every
`--save-steps` steps, with `last.ckpt` beside it. Its one brush with Aerie is the default of
`--checkpoint-dir`, as in hf_train.py: the node's directory that Aerie exports as
AERIE_CHECKPOINT_DIR (`/opt/ml/checkpoints` in a container), when set; `--root-dir` (Lightning's
logs) defaults to SageMaker's SM_OUTPUT_DATA_DIR where it is set. On several nodes, as
Lightning users write it: `--devices` per node and `--num-nodes` (DDP; under torchrun Lightning
takes the ranks torchrun started).

    python examples/byo/lightning_train.py --root-dir /opt/ml/output --checkpoint-dir /opt/ml/checkpoints
    torchrun --nnodes 2 --nproc-per-node 2 ... examples/byo/lightning_train.py --devices 2 --num-nodes 2
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, step_sleep_s: float = 0.0):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.step_sleep_s = step_sleep_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        if self.step_sleep_s:
            import time

            time.sleep(self.step_sleep_s)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR", "."))  # logs, as on SageMaker
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("AERIE_CHECKPOINT_DIR"))
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--tqdm", action="store_true", help="tqdm's bar even where rich is installed")
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--devices", default="auto", help="processes per node (Trainer(devices=...))")
    parser.add_argument("--num-nodes", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.samples, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    callbacks: list = []
    if args.checkpoint_dir:
        callbacks.append(
            ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.save_steps, save_last=True)
        )
    if args.tqdm:
        callbacks.append(TQDMProgressBar())
    trainer = L.Trainer(
        max_steps=args.max_steps,
        default_root_dir=args.root_dir,
        log_every_n_steps=1,
        accelerator="cpu",
        devices=int(args.devices) if args.devices.isdigit() else args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp" if args.num_nodes > 1 or args.devices not in ("auto", "1") else "auto",
        callbacks=callbacks or None,
    )
    trainer.fit(Regressor(args.step_sleep_s), loader, ckpt_path="last")
    print(f"global_step={trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
