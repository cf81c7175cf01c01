"""A stand-in trainer for backend tests: one training step to the metrics stream every --step-s.

It writes what the real trainer writes per step (`{"t", "rank", "step", "loss", ..., "event":
null}`, docs/architecture.md "Metrics stream") and honours Aerie's own fault switch
(`AERIE_FAULTS`, `trainer/faults.py`, the code the real trainer calls), so a backend test gets a
real NaN or busy hang, seen by the real agent, in a few seconds and without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainer.faults import FaultInjector


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.2)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    faults = FaultInjector(rank)
    path = Path(os.environ["AERIE_METRICS_PATH"]) / f"rank-{rank:05d}.jsonl"
    with open(path, "a") as f:
        for step in range(1, args.steps + 1):
            faults.before_step(step)
            time.sleep(args.step_s)
            loss = float("nan") if faults.loss_is_nan(step) else 1.0 / step
            record = {"t": time.time(), "rank": rank, "step": step, "loss": loss, "grad_norm": 1.0, "lr": 1e-3}
            f.write(json.dumps({**record, "tokens": step * 64, "step_s": args.step_s, "event": None}) + "\n")
            f.flush()
    print(f"stepper rank {rank} done: {args.steps} steps on {os.environ.get('SM_CURRENT_HOST')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
