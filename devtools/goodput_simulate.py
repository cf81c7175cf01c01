"""A discrete-event simulation of a long training run under failures (seeded, pure Python).

Used by the checkpoint-interval advice's test (the advised interval beats half and twice of it) and
by `bench/goodput_at_scale.py` (policies at 4,000 GPUs). The run trains, pauses `stall_s` at each
save (S3 tier every `s3_interval_s` of training; optionally a memory tier every
`mem_interval_s`), and at each failure loses the work since the checkpoint it resumes from (the
memory tier when the failure's recovery says so, else S3), then pays detection, restart and
restore. Failures that arrive while a recovery is under way are absorbed by it (a second relaunch
would cost the same again; ignoring them is slightly optimistic for every policy alike).

The result splits the horizon into the ledger's categories (aerie_contracts.goodput), summing to
it exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aerie_contracts.goodput import Category


@dataclass(frozen=True)
class Recovery:
    detect_s: float
    restart_s: float
    restore_s: float
    from_memory: bool = False  # resume from the memory tier (else the last S3 checkpoint)


@dataclass(frozen=True)
class Policy:
    name: str
    s3_interval_s: float
    s3_stall_s: float
    recover: Callable[[str], Recovery]
    mem_interval_s: float | None = None
    mem_stall_s: float = 0.0


def failure_trace(
    horizon_s: float, rate_per_s: float, causes: Sequence[tuple[str, float]], rng: random.Random
) -> list[tuple[float, str]]:
    """Poisson arrivals over the horizon, each with a cause drawn by its share."""
    names = [c for c, _ in causes]
    weights = [w for _, w in causes]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= horizon_s:
            return out
        out.append((t, rng.choices(names, weights)[0]))


def run(horizon_s: float, failures: Sequence[tuple[float, str]], policy: Policy) -> dict[str, Any]:
    """Simulate `policy` over `failures`; node-independent (every category is wall time)."""
    acc = {c.value: 0.0 for c in Category}
    trained = 0.0  # seconds of training done, redone work included
    t, w, last_s3, last_mem, fi = 0.0, 0.0, 0.0, 0.0, 0
    mem = policy.mem_interval_s
    recoveries = 0

    def spend(category: str, seconds: float) -> None:
        nonlocal t
        seconds = max(0.0, min(seconds, horizon_s - t))
        acc[category] += seconds
        t += seconds

    while t < horizon_s:
        while fi < len(failures) and failures[fi][0] < t:
            fi += 1  # arrived during a recovery: absorbed
        next_fail = failures[fi][0] if fi < len(failures) else math.inf
        stop = min(next_fail, horizon_s)
        due_s3 = last_s3 + policy.s3_interval_s
        due_mem = last_mem + mem if mem else math.inf
        target = min(due_s3, due_mem)
        if t + (target - w) >= stop:
            trained += stop - t
            w += stop - t
            t = stop
        else:
            trained += target - w
            t += target - w
            w = target
            to_s3 = target >= due_s3
            stall = policy.s3_stall_s if to_s3 else policy.mem_stall_s
            if t + stall <= stop:
                acc[Category.CHECKPOINT_STALL] += stall
                t += stall
                last_mem = w
                if to_s3:
                    last_s3 = w
                continue
            acc[Category.CHECKPOINT_STALL] += stop - t  # the save never finished
            t = stop
        if t >= horizon_s:
            break
        _, cause = failures[fi]
        fi += 1
        recoveries += 1
        r = policy.recover(cause)
        resume = last_mem if (r.from_memory and mem) else last_s3
        acc[Category.REDONE] += w - resume
        w = last_mem = resume
        last_s3 = min(last_s3, resume)
        spend(Category.DETECTION, r.detect_s)
        spend(Category.RESTART, r.restart_s)
        spend(Category.RESTORE, r.restore_s)
    acc[Category.PRODUCTIVE] = trained - acc[Category.REDONE]
    badput = horizon_s - acc[Category.PRODUCTIVE]
    return {
        "policy": policy.name,
        "goodput": acc[Category.PRODUCTIVE] / horizon_s,
        "badput_s": badput,
        "failures": recoveries,
        "categories_s": acc,
    }
