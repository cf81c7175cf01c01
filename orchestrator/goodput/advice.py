"""Checkpoint-interval advice per checkpoint tier: the Young–Daly interval from the job's measured
save stall and an MTBF.

With a synchronous stall C per save, an interval τ of training between saves and failures arriving
every M seconds on average, the expected share of time lost to checkpointing is, to first order,

    waste(τ) = C / τ  (saving)  +  τ / (2 M)  (on a failure, half an interval is redone on average)

minimised at τ* = √(2 C M) (Young 1974; Daly 2006; `aerie_contracts.goodput.young_daly`, which the
trainer's `checkpoint.every_steps: auto` uses too). Restart cost does not depend on τ and is left
out, so `current_badput` and `advised_badput` compare like with like.

Each tier has its own C and M:

- S3 (`checkpoint.every_steps`): C is the stall of the step after an S3 save (its synchronous
  part), else the save's recorded duration; M counts every infrastructure failure (S3 is what is
  left when a memory copy is lost, and the only tier where the memory tier is off);
- memory (`checkpoint.memory_every_steps`, where the memory tier runs): C is the snapshot's
  synchronous cost the agents report (`snapshot_stall_s`, the slowest rank's per snapshot), else
  the stall of the step after a snapshot; M counts the failures the memory tier recovers from:
  those that leave the allocation usable (restarted in place: not `NOT_REUSABLE`), and every
  failure on a backend whose nodes' memory outlives a relaunch.

M is the job's allocation's: the per-node MTBF over its node count. The per-node MTBF is the
fleet's, observed in the store (the tier's failures of attempts over their node-hours), once at
least `MIN_FAILURES` were seen; else `AERIE_MTBF_H` or Llama 3's published rate (for the memory
tier, every failure counted as one it recovers from).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from aerie_contracts import FailureKind, env
from aerie_contracts.checkpoints import CheckpointTier
from aerie_contracts.failures import policy
from aerie_contracts.goodput import expected_waste, young_daly
from aerie_contracts.restarts import MEMORY_OUTLIVES_RELAUNCH, NOT_REUSABLE
from aerie_contracts.states import AttemptState
from orchestrator.goodput.trace import JobTrace
from orchestrator.store.models import Attempt, Job
from recovery.modes import memory_tier_off

# Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs (Meta, 2024) → per 8-GPU node.
LLAMA3_NODE_MTBF_H = 54 * 24 * 16384 / 8 / 419
MIN_FAILURES = 3
FAILURES = {
    CheckpointTier.S3: "every infrastructure failure",
    CheckpointTier.MEMORY: "failures the memory tier recovers from (the allocation survives them)",
}

__all__ = ["expected_waste", "young_daly"]


def infrastructure_failure(kind: str | None) -> bool:
    """A failure the fleet caused (retried, not the user's code or data): what MTBF counts."""
    p = policy(kind)
    return p is not None and p.retry and not p.user_error and kind not in (FailureKind.LOSS_NAN, FailureKind.LOSS_SPIKE)


@dataclass
class Fleet:
    """Infrastructure failures of every attempt and the node-seconds they were observed over."""

    failures: int = 0
    not_reusable: int = 0  # of which the allocation could not be reused (a node lost, preempted...)
    node_s: float = 0.0

    def failures_of(self, tier: CheckpointTier, backend: str) -> int:
        if tier == CheckpointTier.MEMORY and backend not in MEMORY_OUTLIVES_RELAUNCH:
            return self.failures - self.not_reusable
        return self.failures

    def node_mtbf_s(self, tier: CheckpointTier = CheckpointTier.S3, backend: str = "") -> float | None:
        failures = self.failures_of(tier, backend)
        return self.node_s / failures if failures >= MIN_FAILURES and self.node_s > 0 else None


def fleet(s: Session, now: float) -> Fleet:
    """The fleet's failures and node-seconds, aggregated in the database: two queries returning a
    row per failure kind, however many attempts there are."""
    nodes = func.coalesce(Job.spec[("resources", "instance_count")].as_integer(), 1)
    span = func.coalesce(Attempt.ended_at, now) - Attempt.started_at
    node_s = s.scalar(
        select(func.sum(case((span > 0, span * nodes), else_=0.0)))
        .select_from(Attempt)
        .join(Job, Attempt.job_id == Job.id)
        .where(Attempt.started_at.is_not(None))
    )
    seen = Fleet(node_s=float(node_s or 0.0))
    kind = Attempt.reason["kind"].as_string()
    q = (
        select(kind, func.count())
        .where(Attempt.state == AttemptState.FAILED, Attempt.started_at.is_not(None))
        .group_by(kind)
    )
    for k, n in s.execute(q):
        if infrastructure_failure(k):
            seen.failures += n
            seen.not_reusable += n if k in NOT_REUSABLE else 0
    return seen


def fleet_node_mtbf_s(s: Session, now: float) -> tuple[float | None, int, float]:
    """(per-node MTBF in seconds or None, failures seen, node-seconds observed) over every attempt."""
    seen = fleet(s, now)
    return seen.node_mtbf_s(), seen.failures, seen.node_s


def setting_node_mtbf_s() -> float:
    raw = env.MTBF_H.get()
    try:
        hours = float(raw) if raw else LLAMA3_NODE_MTBF_H
    except ValueError:
        hours = LLAMA3_NODE_MTBF_H
    return (hours if hours > 0 else LLAMA3_NODE_MTBF_H) * 3600.0


def advise(
    trace: JobTrace, node_mtbf_s: float, source: str, tier: CheckpointTier = CheckpointTier.S3
) -> dict[str, Any] | None:
    """Advice for one of the job's checkpoint tiers, or None until it has saved and stepped (C and
    step time measured), or when the job has no such tier."""
    from orchestrator.goodput.ledger import step_time

    d = step_time([p for a in trace.attempts for p in a.points])
    if not d:
        return None
    if tier == CheckpointTier.MEMORY:
        if memory_tier_off(trace.spec, trace.backend):
            return None
        stalls = _snapshot_stalls(trace, d)
        every = trace.memory_every_steps or _observed_every(trace, CheckpointTier.MEMORY)
    else:
        if not (trace.spec.get("checkpoint") or {}).get("s3_uri") and not trace.checkpoints:
            return None
        stalls = _save_stalls(trace, d)
        every = trace.every_steps or _observed_every(trace, CheckpointTier.S3)
    if not stalls:
        return None
    c = max(statistics.median(stalls), 1e-4)
    mtbf = node_mtbf_s / max(1, trace.nodes)
    advised = young_daly(c, mtbf)
    current = every * d if every else None
    return {
        "tier": tier.value,
        "failures": FAILURES[tier],
        "save_stall_s": c,
        "mtbf_s": mtbf,
        "mtbf_source": source,
        "step_s": d,
        "current_every_steps": every or None,
        "current_interval_s": current,
        "advised_interval_s": advised,
        "advised_every_steps": max(1, round(advised / d)),
        "current_badput": expected_waste(current, c, mtbf) if current else None,
        "advised_badput": expected_waste(advised, c, mtbf),
    }


def _gap_stalls(trace: JobTrace, d: float, tier: CheckpointTier) -> list[float]:
    """The excess over the step time of each step right after a save of `tier` (its stall)."""
    saved = {c.step for c in trace.checkpoints if c.tier == tier}
    return [
        max(0.0, (t1 - t0) - d)
        for a in trace.attempts
        for (s0, t0), (s1, t1) in zip(a.points, a.points[1:])
        if s1 == s0 + 1 and s0 in saved
    ]


def _save_stalls(trace: JobTrace, d: float) -> list[float]:
    stalls = _gap_stalls(trace, d, CheckpointTier.S3)
    if not stalls:
        stalls = [c.save_s for c in trace.checkpoints if c.save_s and c.tier == CheckpointTier.S3]
    return stalls


def _snapshot_stalls(trace: JobTrace, d: float) -> list[float]:
    measured = [a.snapshot_s for a in trace.attempts if a.snapshot_s is not None]
    return measured or _gap_stalls(trace, d, CheckpointTier.MEMORY)


def _observed_every(trace: JobTrace, tier: CheckpointTier) -> int | None:
    """The interval a job's saves of `tier` were taken at (`auto`): the median step distance of
    consecutive ones of an attempt."""
    steps: dict[int | None, list[int]] = {}
    for c in trace.checkpoints:
        if c.tier == tier:
            steps.setdefault(c.attempt, []).append(c.step)
    gaps = [b - a for xs in steps.values() for a, b in zip(sorted(xs), sorted(xs)[1:]) if b > a]
    return round(statistics.median(gaps)) if gaps else None


def for_job(s: Session, trace: JobTrace) -> list[dict[str, Any]]:
    """The advice for each of the job's checkpoint tiers that has been measured."""
    seen = fleet(s, trace.now)
    out = []
    for tier in (CheckpointTier.S3, CheckpointTier.MEMORY):
        mtbf = seen.node_mtbf_s(tier, trace.backend)
        adv = (
            advise(trace, mtbf, "fleet", tier)
            if mtbf is not None
            else advise(trace, setting_node_mtbf_s(), "setting", tier)
        )
        if adv is not None:
            out.append(adv)
    return out


def checkpoint_mtbf_env(s: Session, job: Job, now: float) -> dict[str, str]:
    """`AERIE_CHECKPOINT_MTBF_S` for a job whose spec asks `checkpoint.every_steps: auto`: the MTBF
    of its allocation the S3 tier's advice would use (the trainer derives its interval from it)."""
    spec = job.spec or {}
    if (spec.get("checkpoint") or {}).get("every_steps") != "auto":
        return {}
    node_mtbf = fleet(s, now).node_mtbf_s() or setting_node_mtbf_s()
    nodes = int((spec.get("resources") or {}).get("instance_count") or 1)
    return {env.CHECKPOINT_MTBF_S: f"{node_mtbf / max(1, nodes):.1f}"}
