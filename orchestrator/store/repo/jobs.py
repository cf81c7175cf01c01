"""Jobs and their attempts: creation, lookup and state changes (each with its event)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, selectinload

from aerie_contracts import DetailType
from aerie_contracts.restarts import CAUSE_REPLACED_NODES
from aerie_contracts.states import ATTEMPT_TERMINAL, JOB_TERMINAL, AttemptState, JobState
from orchestrator.store.models import (
    Attempt,
    Job,
    now,
)
from orchestrator.store.repo.checkpoints import expire_memory_checkpoints
from orchestrator.store.repo.outbox import emit


class NotFound(LookupError):
    pass


T = TypeVar("T")


def found(row: T | None, what: str) -> T:
    """`row`, or NotFound("no <what>") where the lookup found nothing."""
    if row is None:
        raise NotFound(f"no {what}")
    return row


# --- jobs -------------------------------------------------------------------------------------------


def create_job(s: Session, spec: dict[str, Any], tenant: str) -> Job:
    job = Job(
        id=f"{spec['name'][:50]}-{secrets.token_hex(3)}",
        tenant=tenant,
        name=spec["name"],
        spec=spec,
        backend=spec.get("backend", "local"),
        state=JobState.SUBMITTED,
    )
    s.add(job)
    s.flush()
    emit(s, job, DetailType.JOB_STATE_CHANGE, {"state": JobState.SUBMITTED})
    return job


def get_job(s: Session, tenant: str, ref: str) -> Job:
    """A job by id, or by name (the newest of that name), within the tenant."""
    job = s.scalars(
        select(Job)
        .where(Job.tenant == tenant, or_(Job.id == ref, Job.name == ref))
        .order_by((Job.id == ref).desc(), Job.created_at.desc())
        .limit(1)
    ).first()
    return found(job, f"job {ref!r}")


def list_jobs(
    s: Session,
    tenant: str,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
    name: str | None = None,
    backend: str | None = None,
    with_attempts: bool = False,
) -> Sequence[Job]:
    q = select(Job).where(Job.tenant == tenant)
    if state:
        q = q.where(Job.state == state)
    if name:
        q = q.where(Job.name.contains(name, autoescape=True))
    if backend:
        q = q.where(Job.backend == backend)
    if with_attempts:  # a jobs list shows attempts and nodes: two more queries, not two per job
        q = q.options(selectinload(Job.attempts).selectinload(Attempt.nodes))
    return s.scalars(q.order_by(Job.created_at.desc()).limit(limit).offset(offset)).all()


def list_jobs_in_state(s: Session, state: str) -> Sequence[Job]:
    return s.scalars(select(Job).where(Job.state == state).order_by(Job.created_at)).all()


def jobs_stopping(s: Session) -> Sequence[Job]:
    return s.scalars(select(Job).where(Job.stop_requested.is_(True), Job.state.not_in(JOB_TERMINAL))).all()


def set_job_state(s: Session, job: Job, state: str, reason: dict[str, Any] | None = None) -> None:
    if job.state == state:
        return
    job.state = state
    if reason is not None:
        job.reason = reason
    if state in JOB_TERMINAL:
        job.ended_at = now()
        expire_memory_checkpoints(s, job, job_over=True)  # its agents remove their memory areas
    detail: dict[str, Any] = {"state": state}
    if reason is not None:
        detail["reason"] = reason
    emit(s, job, DetailType.JOB_STATE_CHANGE, detail)


# --- attempts ---------------------------------------------------------------------------------------


def create_attempt(
    s: Session, job: Job, number: int, resume_from: str | None = None, exclude_nodes: list[str] | None = None
) -> Attempt:
    attempt = Attempt(
        id=f"{job.id}-a{number}",
        job_id=job.id,
        number=number,
        state=AttemptState.PENDING,
        resume_from=resume_from,
        exclude_nodes=exclude_nodes or [],
    )
    s.add(attempt)
    s.flush()  # the (job, number) unique constraint fires here for a duplicate
    return attempt


def get_attempt(s: Session, attempt_id: str) -> Attempt:
    return found(s.get(Attempt, attempt_id), f"attempt {attempt_id!r}")


def attempts_in(s: Session, states: set[str]) -> Sequence[Attempt]:
    return s.scalars(select(Attempt).where(Attempt.state.in_(states)).order_by(Attempt.created_at)).all()


def set_attempt_state(
    s: Session, attempt: Attempt, state: str, reason: dict[str, Any] | None = None, exit_code: int | None = None
) -> None:
    if attempt.state == state:
        return
    attempt.state = state
    if reason is not None:
        attempt.reason = reason
    if exit_code is not None:
        attempt.exit_code = exit_code
    if state == AttemptState.RUNNING:
        attempt.started_at = now()
    if state in ATTEMPT_TERMINAL:
        attempt.ended_at = now()
    if state == AttemptState.LAUNCHING:
        return  # internal bookkeeping, not an event users care about
    detail: dict[str, Any] = {"attempt_id": attempt.id, "attempt": attempt.number, "state": state}
    if reason is not None:
        detail["reason"] = reason
    if exit_code is not None:
        detail["exit_code"] = exit_code
    if attempt.resume_from:
        detail["resume_from"] = attempt.resume_from
    if state == AttemptState.RUNNING and isinstance(attempt.handle, dict):
        detail.update(_placement(attempt))
    emit(s, attempt.job, DetailType.ATTEMPT_STATE_CHANGE, detail)


def _placement(attempt: Attempt) -> dict[str, Any]:
    """Where a running attempt runs, for its event: its hosts, its hot spares, and the spares that
    took failed nodes' slots (the record of which node was a spare)."""
    handle = attempt.handle or {}
    out: dict[str, Any] = {}
    if handle.get("hosts"):
        out["hosts"] = [str(h) for h in handle["hosts"]]
    if handle.get("spares"):
        out["spares"] = [str(h) for h in handle["spares"]]
    replaced = (attempt.cause or {}).get(CAUSE_REPLACED_NODES)
    if replaced:
        out["replaced_nodes"] = dict(replaced)
    return out
