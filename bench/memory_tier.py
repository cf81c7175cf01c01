"""The in-memory checkpoint tier's costs on the tiny model (issue #22): one JSON line.

Single process, CPU: mean step time of `pythia-tiny` (AdamW, random tokens), the time a rank is
blocked writing one snapshot into shared memory (`trainer.checkpoint.memory`), the interval the
`auto` rule picks from them (<= 1 % of step time) and the overhead that gives, the replication of
one snapshot to a peer agent over loopback TCP (`agent.memckpt.replicate`, a server in a second
process) and the restore (verify + load into the model). Ratios, not goals: the issue's goal is
snapshot overhead <= 2 % of step time, measured in the same run.

    .venv/bin/python bench/memory_tier.py [--steps 20] [--snapshots 5] [--batch 8] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from aerie_contracts import env as E
from aerie_contracts import memckpt
from agent.memckpt import replicate
from agent.memckpt.store import SnapshotStore
from trainer.checkpoint import memory
from trainer.models import build_model, get_preset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--snapshots", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = build_model(get_preset("pythia-tiny"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = model.config.vocab_size if hasattr(model, "config") else 512

    def step() -> float:
        t0 = time.perf_counter()
        x = torch.randint(0, min(vocab, 512), (args.batch, args.seq + 1))
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    for _ in range(3):
        step()  # warm-up
    step_s = statistics.median(step() for _ in range(args.steps))

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="aerie-bench-", dir=base))
    try:
        snap = memory.MemorySnapshotter(job="bench", attempt=1, rank=0, every=1, root=root / "a")
        costs = []
        for i in range(args.snapshots):
            header = snap.snapshot(i + 1, model, opt, None, {"step": i + 1})
            costs.append(snap.last_cost_s or 0.0)
        snapshot_s = statistics.median(costs)
        auto = memory.AutoInterval()
        auto.observe_snapshot(1, snapshot_s, step_s)
        every = auto.every() or 1

        key = replicate.new_key()
        peer = subprocess.Popen(
            [sys.executable, "-m", "agent.memckpt", "--root", str(root / "b")],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, E.MEMORY_CHECKPOINT_KEY: key},
        )
        try:
            line = peer.stdout.readline() if peer.stdout else ""
            host, port = line.split()[1].rsplit(":", 1)
            t0 = time.perf_counter()
            replicate.send_snapshot(
                (host, int(port)), snap.path(args.snapshots), job="bench", node="a", key=bytes.fromhex(key)
            )
            replicate_s = time.perf_counter() - t0
            store_b = SnapshotStore("bench", root / "b")
            assert store_b.find(0, args.snapshots, replica_of="a") is not None
        finally:
            peer.terminate()
            peer.wait(timeout=10)
        t0 = time.perf_counter()
        memory.load_snapshot(snap.path(args.snapshots), model, opt, None)
        restore_s = time.perf_counter() - t0
        size = memckpt.HEADER_SIZE + header.size
        print(
            json.dumps(
                {
                    "model": "pythia-tiny",
                    "snapshot_bytes": size,
                    "step_s": round(step_s, 5),
                    "snapshot_s": round(snapshot_s, 5),
                    "snapshot_over_step": round(snapshot_s / step_s, 4),
                    "auto_every_steps": every,
                    "overhead_at_auto": round(snapshot_s / (every * step_s), 5),
                    "overhead_every_step": round(snapshot_s / step_s, 4),
                    "replicate_s": round(replicate_s, 5),
                    "replicate_mb_s": round(size / replicate_s / 1e6, 1),
                    "restore_s": round(restore_s, 5),
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
