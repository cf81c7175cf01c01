"""Checkpoint-interval advice: the Young–Daly interval from the job's measured save stall and an MTBF.

With a synchronous stall C per save, an interval τ of training between saves and failures arriving
every M seconds on average, the expected share of time lost to checkpointing is, to first order,

    waste(τ) = C / τ  (saving)  +  τ / (2 M)  (on a failure, half an interval is redone on average)

minimised at τ* = √(2 C M) (Young 1974; Daly 2006). Restart cost does not depend on τ and is left
out, so `current_badput` and `advised_badput` compare like with like.

M is the job's allocation's: the per-node MTBF over its node count. The per-node MTBF is the
fleet's, observed in the store (infrastructure failures of attempts over their node-hours), once
at least `MIN_FAILURES` were seen; else `AERIE_MTBF_H` or Llama 3's published rate.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aerie_contracts import FailureKind, env
from aerie_contracts.failures import policy
from aerie_contracts.states import AttemptState
from orchestrator.goodput.trace import JobTrace
from orchestrator.store.models import Attempt, Job

# Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs (Meta, 2024) → per 8-GPU node.
LLAMA3_NODE_MTBF_H = 54 * 24 * 16384 / 8 / 419
MIN_FAILURES = 3


def young_daly(save_stall_s: float, mtbf_s: float) -> float:
    """√(2·C·MTBF): the checkpoint interval (seconds of training between saves) that wastes least."""
    if save_stall_s <= 0 or mtbf_s <= 0:
        raise ValueError("the save stall and the MTBF must be positive")
    return math.sqrt(2.0 * save_stall_s * mtbf_s)


def expected_waste(interval_s: float, save_stall_s: float, mtbf_s: float) -> float:
    """Expected share of time lost to saves and redone work at `interval_s` (first order)."""
    if interval_s <= 0:
        raise ValueError("the interval must be positive")
    return save_stall_s / interval_s + interval_s / (2.0 * mtbf_s)


def infrastructure_failure(kind: str | None) -> bool:
    """A failure the fleet caused (retried, not the user's code or data): what MTBF counts."""
    p = policy(kind)
    return p is not None and p.retry and not p.user_error and kind not in (FailureKind.LOSS_NAN, FailureKind.LOSS_SPIKE)


def fleet_node_mtbf_s(s: Session, now: float) -> tuple[float | None, int, float]:
    """(per-node MTBF in seconds or None, failures seen, node-seconds observed) over every attempt."""
    q = select(Attempt.state, Attempt.reason, Attempt.started_at, Attempt.ended_at, Job.spec).join(
        Job, Attempt.job_id == Job.id
    )
    failures, node_s = 0, 0.0
    for state, reason, started, ended, spec in s.execute(q.where(Attempt.started_at.is_not(None))):
        nodes = int(((spec or {}).get("resources") or {}).get("instance_count") or 1)
        node_s += max(0.0, (ended if ended is not None else now) - started) * nodes
        if state == AttemptState.FAILED and infrastructure_failure((reason or {}).get("kind")):
            failures += 1
    if failures < MIN_FAILURES or node_s <= 0:
        return None, failures, node_s
    return node_s / failures, failures, node_s


def setting_node_mtbf_s() -> float:
    raw = env.MTBF_H.get()
    try:
        hours = float(raw) if raw else LLAMA3_NODE_MTBF_H
    except ValueError:
        hours = LLAMA3_NODE_MTBF_H
    return (hours if hours > 0 else LLAMA3_NODE_MTBF_H) * 3600.0


def advise(trace: JobTrace, node_mtbf_s: float, source: str) -> dict[str, Any] | None:
    """Advice for the job's S3 tier, or None until it has saved and stepped (C and step time measured).

    C is the median measured stall of the job's saves: the excess of the step after a save over
    the median step time (the save's synchronous part), else the save's recorded duration."""
    from orchestrator.goodput.ledger import step_time

    d = step_time([p for a in trace.attempts for p in a.points])
    stalls = _save_stalls(trace, d) if d else []
    if not d or not stalls:
        return None
    c = max(statistics.median(stalls), 1e-3)
    mtbf = node_mtbf_s / max(1, trace.nodes)
    every = trace.every_steps or 0
    advised = young_daly(c, mtbf)
    advised_steps = max(1, round(advised / d))
    current = every * d if every else None
    return {
        "save_stall_s": c,
        "mtbf_s": mtbf,
        "mtbf_source": source,
        "step_s": d,
        "current_every_steps": every or None,
        "current_interval_s": current,
        "advised_interval_s": advised,
        "advised_every_steps": advised_steps,
        "current_badput": expected_waste(current, c, mtbf) if current else None,
        "advised_badput": expected_waste(advised, c, mtbf),
    }


def _save_stalls(trace: JobTrace, d: float) -> list[float]:
    stalls = []
    saved = {c.step: c for c in trace.checkpoints}
    for a in trace.attempts:
        for (s0, t0), (s1, t1) in zip(a.points, a.points[1:]):
            if s1 == s0 + 1 and s0 in saved:
                stalls.append(max(0.0, (t1 - t0) - d))
    if not stalls:
        stalls = [c.save_s for c in trace.checkpoints if c.save_s]
    return stalls


def for_job(s: Session, trace: JobTrace) -> dict[str, Any] | None:
    mtbf, _, _ = fleet_node_mtbf_s(s, trace.now)
    if mtbf is not None:
        return advise(trace, mtbf, "fleet")
    return advise(trace, setting_node_mtbf_s(), "setting")
