"""What the ledger is computed from: a job's recorded history, read from the store into plain data.

Nothing here is new bookkeeping: attempts (created/started/ended, resume point, failure reason),
verdicts (when a detector fired, server time), rank 0's step points (step, end time), and committed
checkpoints (step, the save's duration and size from the trainer's `checkpoint_committed` line).
Keeping the ledger a pure function of this trace makes it testable without a store and exact
across restarts (it is recomputed, never accumulated).

An attempt restarted in place (`aerie_contracts.restarts`) is served by the agents of the attempt
before it: its `mode` comes from its `cause`, and what its nodes measured (restore, the step they
really resumed at, snapshot costs) from their heartbeats to it. A step point stamped before its
attempt was even created cannot be its own (a batch of the attempt before, delivered late): it is
left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from aerie_contracts.checkpoints import CheckpointTier, step_of_uri
from aerie_contracts.failures import FailureKind
from aerie_contracts.goodput import SUMMARY_RESTORE_S, SUMMARY_RESTORED_STEP, SUMMARY_SNAPSHOT_S
from aerie_contracts.restarts import RestartMode, mode_of
from orchestrator.store.models import Checkpoint, Job, MetricPoint, Verdict, columns

LOSS_KINDS = frozenset({FailureKind.LOSS_NAN, FailureKind.LOSS_SPIKE})


@dataclass
class AttemptTrace:
    number: int
    state: str
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    resumed_step: int | None = None  # the step it resumed at: what its ranks restored, else `resume_from`'s
    restore_s: float | None = None  # measured: the slowest node's restore (heartbeat summaries)
    mode: str = RestartMode.RELAUNCH.value  # how it started after the attempt before (in place or relaunched)
    snapshot_s: float | None = None  # measured: the slowest node's in-memory snapshot stall
    reason_kind: str | None = None
    verdicts: list[tuple[float, str]] = field(default_factory=list)  # (t, kind), by time
    points: list[tuple[int, float]] = field(default_factory=list)  # (step, t), by step
    # A loss verdict's step (loss.nan, loss.spike): the fault is in the numbers from that step on,
    # however many steps ran before the verdict stopped the attempt.
    loss_fault_step: int | None = None


@dataclass
class CheckpointTrace:
    attempt: int | None
    step: int
    save_s: float | None
    size_bytes: int | None
    created_at: float
    tier: str = CheckpointTier.S3.value


@dataclass
class JobTrace:
    job_id: str
    name: str
    state: str
    nodes: int
    created_at: float
    ended_at: float | None
    now: float
    every_steps: int | None = None
    eval_every: int | None = None
    backend: str = ""
    memory_every_steps: int | None = None  # the spec's; None: `auto` (or no memory tier)
    spec: dict = field(default_factory=dict)
    attempts: list[AttemptTrace] = field(default_factory=list)
    checkpoints: list[CheckpointTrace] = field(default_factory=list)


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _slowest(nodes, key: str) -> float | None:
    return max((x for n in nodes for x in [_float((n.summary or {}).get(key))] if x is not None), default=None)


def _resumed(nodes, resume_from: str | None) -> int | None:
    """The step the ranks restored (the lowest any node reports), else the one `resume_from` names."""
    values = [_float((n.summary or {}).get(SUMMARY_RESTORED_STEP)) for n in nodes]
    reported = [int(x) for x in values if x is not None and x >= 0]
    return min(reported) if reported else step_of_uri(resume_from)


def read(s: Session, job: Job, now: float | None = None) -> JobTrace:
    """The job's trace, in four queries (attempts come with the job)."""
    spec = job.spec or {}
    hps = spec.get("hyperparameters") or {}
    ckpt = spec.get("checkpoint") or {}
    trace = JobTrace(
        job_id=job.id,
        name=job.name,
        state=job.state,
        nodes=int((spec.get("resources") or {}).get("instance_count") or 1),
        created_at=job.created_at,
        ended_at=job.ended_at,
        now=time.time() if now is None else now,
        every_steps=_int(ckpt.get("every_steps")),
        eval_every=_int(hps.get("eval_every")),
        backend=job.backend,
        memory_every_steps=_int(ckpt.get("memory_every_steps")),
        spec=spec,
    )
    by_id = {}
    for a in job.attempts:
        at = AttemptTrace(
            **columns(a, "number", "state", "created_at", "started_at", "ended_at"),
            resumed_step=_resumed(a.nodes, a.resume_from) if a.resume_from else None,
            restore_s=_slowest(a.nodes, SUMMARY_RESTORE_S),
            reason_kind=(a.reason or {}).get("kind"),
            mode=mode_of(a.cause).value,
            snapshot_s=_slowest(a.nodes, SUMMARY_SNAPSHOT_S),
        )
        by_id[a.id] = at
        trace.attempts.append(at)
    if by_id:
        for v in s.scalars(select(Verdict).where(Verdict.attempt_id.in_(list(by_id))).order_by(Verdict.t)):
            at = by_id[v.attempt_id]
            at.verdicts.append((v.t, v.kind))
            step = (v.evidence or {}).get("step")
            if v.kind in LOSS_KINDS and isinstance(step, int) and at.loss_fault_step is None:
                at.loss_fault_step = step
    q = (
        select(MetricPoint.attempt_id, MetricPoint.step, MetricPoint.t)
        .where(MetricPoint.job_id == job.id)
        .order_by(MetricPoint.attempt_number, MetricPoint.step)
    )
    for attempt_id, step, t in s.execute(q):
        at = by_id.get(attempt_id)
        if at is not None and t >= at.created_at:  # an earlier point is the attempt before's, sent late
            at.points.append((step, t))
    for c in s.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)):
        meta = c.meta or {}
        owner = by_id.get(c.attempt_id or "")
        trace.checkpoints.append(
            CheckpointTrace(
                attempt=owner.number if owner else None,
                step=c.step,
                save_s=_float(meta.get("save_s")),
                size_bytes=c.size_bytes,
                created_at=c.created_at,
                tier=c.tier,
            )
        )
    return trace
