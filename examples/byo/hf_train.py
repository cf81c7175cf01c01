"""A typical Hugging Face Trainer script, written as a user would, with nothing of Aerie in it.

A tiny GPT-NeoX built from a config object, trained on generated text (byte-level tokens),
checkpointing every `--save-steps` into `--output-dir` and resuming from the newest checkpoint
there when one exists. Under torchrun it is data-parallel (gloo on CPU).

    torchrun --nproc-per-node 2 examples/byo/hf_train.py --output-dir /opt/ml/checkpoints
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

WORDS = "the quick brown fox jumps over a lazy dog while seven cats watch quietly".split()  # noqa: SIM905


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, seed: int = 0, read_s: float = 0.0):
        rng = random.Random(seed)
        self.read_s = read_s  # each row's read time: a large evaluation set on slow storage
        text = " ".join(rng.choice(WORDS) for _ in range(n * seq_len))
        ids = list(text.encode())
        self.rows = [ids[i * seq_len : (i + 1) * seq_len] for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        if self.read_s:
            time.sleep(self.read_s)
        ids = torch.tensor(self.rows[i])
        return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", default=os.environ.get("AERIE_CHECKPOINT_DIR", "/opt/ml/checkpoints"))
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--logging-steps", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow each step down (seconds)")
    p.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--eval-rows", type=int, default=64, help="rows of the evaluation set")
    p.add_argument("--eval-read-s", type=float, default=0.0, help="read time of one evaluation row (seconds)")
    p.add_argument("--report-to", default="none", help="transformers' report_to: none | tensorboard | ...")
    args = p.parse_args()

    config = GPTNeoXConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        save_total_limit=2,
        report_to=[] if args.report_to == "none" else [args.report_to],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        per_device_eval_batch_size=4,
    )
    evaluation = TextDataset(args.eval_rows, 32, seed=1, read_s=args.eval_read_s) if args.eval_steps else None
    trainer = Trainer(model=model, args=training_args, train_dataset=TextDataset(512, 32), eval_dataset=evaluation)
    if args.step_sleep:
        from transformers import TrainerCallback

        class Slow(TrainerCallback):
            def on_step_end(self, *a, **k):
                time.sleep(args.step_sleep)

        trainer.add_callback(Slow())
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    # What PyTorch asks of every torchrun script: without it, gloo's threads can race the
    # interpreter's exit and a rank that finished training dies of SIGABRT.
    # A barrier first: a rank that tore its group down while a peer was still finishing its last
    # collective (HF's final save and logging) left that peer blocked at exit.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
