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
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from aerie_contracts.checkpoints import CheckpointTier, step_of_uri
from aerie_contracts.failures import FailureKind
from aerie_contracts.goodput import SUMMARY_RESTORE_S, SUMMARY_RESTORED_STEP, SUMMARY_SNAPSHOT_S
from aerie_contracts.restarts import RestartMode, mode_of
from orchestrator.store.models import Attempt, Checkpoint, Job, MetricPoint, Verdict, columns

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
    preflight_s: float | None = None  # measured: the slowest node's pre-flight checks (nodes.preflight)


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
    """The job's trace."""
    return read_many(s, [job], now)[0]


CHUNK = 500  # ids per IN list (well under any database's parameter limit)


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


def read_many(s: Session, jobs: Sequence[Job], now: float | None = None) -> list[JobTrace]:
    """The traces of `jobs`, in five queries per `CHUNK` of them, however many there are (the
    /metrics scrape reads every running job's)."""
    now = time.time() if now is None else now
    traces = {job.id: _job_trace(job, now) for job in jobs}
    by_id: dict[str, AttemptTrace] = {}
    owner: dict[str, JobTrace] = {}
    for ids in _chunks(list(traces)):
        q = select(Attempt).where(Attempt.job_id.in_(ids)).options(selectinload(Attempt.nodes)).order_by(Attempt.number)
        for a in s.scalars(q):
            at = AttemptTrace(
                **columns(a, "number", "state", "created_at", "started_at", "ended_at"),
                resumed_step=_resumed(a.nodes, a.resume_from) if a.resume_from else None,
                restore_s=_slowest(a.nodes, SUMMARY_RESTORE_S),
                reason_kind=(a.reason or {}).get("kind"),
                mode=mode_of(a.cause).value,
                snapshot_s=_slowest(a.nodes, SUMMARY_SNAPSHOT_S),
                preflight_s=max(
                    (x for n in a.nodes for x in [_float((n.preflight or {}).get("elapsed_s"))] if x is not None),
                    default=None,
                ),
            )
            by_id[a.id] = at
            owner[a.id] = traces[a.job_id]
            traces[a.job_id].attempts.append(at)
    for ids in _chunks(list(by_id)):
        for v in s.scalars(select(Verdict).where(Verdict.attempt_id.in_(ids)).order_by(Verdict.t)):
            at = by_id[v.attempt_id]
            at.verdicts.append((v.t, v.kind))
            step = (v.evidence or {}).get("step")
            if v.kind in LOSS_KINDS and isinstance(step, int) and at.loss_fault_step is None:
                at.loss_fault_step = step
    for ids in _chunks(list(traces)):
        q = (
            select(MetricPoint.attempt_id, MetricPoint.step, MetricPoint.t)
            .where(MetricPoint.job_id.in_(ids))
            .order_by(MetricPoint.job_id, MetricPoint.attempt_number, MetricPoint.step)
        )
        for attempt_id, step, t in s.execute(q):
            at = by_id.get(attempt_id)
            if at is not None and t >= at.created_at:  # an earlier point is the attempt before's, sent late
                at.points.append((step, t))
        q = select(Checkpoint).where(Checkpoint.job_id.in_(ids)).order_by(Checkpoint.step, Checkpoint.id)
        for c in s.scalars(q):
            meta = c.meta or {}
            writer = by_id.get(c.attempt_id or "")
            traces[c.job_id].checkpoints.append(
                CheckpointTrace(
                    attempt=writer.number if writer else None,
                    step=c.step,
                    save_s=_float(meta.get("save_s")),
                    size_bytes=c.size_bytes,
                    created_at=c.created_at,
                    tier=c.tier,
                )
            )
    return [traces[job.id] for job in jobs]


def _job_trace(job: Job, now: float) -> JobTrace:
    spec = job.spec or {}
    hps = spec.get("hyperparameters") or {}
    ckpt = spec.get("checkpoint") or {}
    return JobTrace(
        job_id=job.id,
        name=job.name,
        state=job.state,
        nodes=int((spec.get("resources") or {}).get("instance_count") or 1),
        created_at=job.created_at,
        ended_at=job.ended_at,
        now=now,
        every_steps=_int(ckpt.get("every_steps")),
        eval_every=_int(hps.get("eval_every")),
        backend=job.backend,
        memory_every_steps=_int(ckpt.get("memory_every_steps")),
        spec=spec,
    )
