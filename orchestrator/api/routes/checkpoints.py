"""Checkpoint records that tell the truth: fenced commits, and `bad` / `deleted` as they happen.

Attempt-scoped routes (agent token of that attempt; the trainer's rank 0 calls them through
`aerie_checkpoint.fence`): whether the attempt is still its job's current one, the job's
record, recording a commit — refused with 409 once the attempt was superseded, checked in the
transaction that inserts the row — and marking a checkpoint bad after a failed restore. The
job-scoped route is for handlers and people: `chain_restart` reports checkpoints whose
verification failed, `checkpoint_gc` the ones it deleted.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from aerie_contracts.states import ATTEMPT_ACTIVE
from orchestrator.api.deps import AttemptDep, SessionDep, WriterDep, job_of
from orchestrator.api.schemas import (
    AUTH_ERRORS,
    AttemptViewOut,
    CheckpointBadIn,
    CheckpointIn,
    CheckpointOut,
    CheckpointStateIn,
    CheckpointStateOut,
    ErrorOut,
)
from orchestrator.store import repo
from orchestrator.store.models import Attempt, Checkpoint, columns

SUPERSEDED = {409: {"model": ErrorOut, "description": "The attempt is no longer its job's current one (fenced)"}}

attempts = APIRouter(prefix="/v1/attempts/{attempt_id}", tags=["agents"], responses=AUTH_ERRORS)
jobs = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=AUTH_ERRORS)


def checkpoint_out(c: Checkpoint) -> CheckpointOut:
    return CheckpointOut(
        **columns(c, "step", "uri", "state", "attempt_id", "size_bytes", "created_at", "reason", "state_at"),
        meta=c.meta or {},
        tier=c.tier or "s3",
    )


def record(s: Session, attempt: Attempt, body: CheckpointIn) -> dict:
    """Record a committed checkpoint, or 409 when its attempt was superseded (the agents' route
    for `checkpoint_committed` lines and the trainer's own commit both come here)."""
    try:
        created = repo.record_checkpoint(s, attempt, body.step, body.uri, body.meta, tier=body.tier)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    except repo.Superseded as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return {"ok": True, "new": created is not None}


@attempts.get("", response_model=AttemptViewOut)
def attempt_view(s: SessionDep, attempt: AttemptDep) -> AttemptViewOut:
    """Whether this attempt is still its job's current one: a superseded attempt's ranks must not
    commit (their record would be refused anyway)."""
    newest = s.scalars(select(Attempt.number).where(Attempt.job_id == attempt.job_id)).all()
    current = attempt.state in ATTEMPT_ACTIVE and attempt.number >= max(newest)
    return AttemptViewOut(
        id=attempt.id, job_id=attempt.job_id, number=attempt.number, state=attempt.state, current=current
    )


@attempts.get("/checkpoints", response_model=list[CheckpointOut])
def attempt_job_checkpoints(s: SessionDep, attempt: AttemptDep) -> list[CheckpointOut]:
    """The record of the attempt's job's checkpoints (what a restore may fall back to)."""
    return [checkpoint_out(c) for c in repo.list_checkpoints(s, attempt.job)]


@attempts.post("/checkpoints", responses=SUPERSEDED)
def commit_checkpoint(s: SessionDep, attempt: AttemptDep, body: CheckpointIn) -> dict:
    return record(s, attempt, body)


@attempts.post("/checkpoints/bad", response_model=CheckpointStateOut, responses=SUPERSEDED)
def mark_bad(s: SessionDep, attempt: AttemptDep, body: CheckpointBadIn) -> CheckpointStateOut:
    """A restore from this checkpoint of the job failed. Only the job's current attempt may say so:
    a zombie must not take resume points away from the attempt that replaced it."""
    if not repo.hold_current_attempt(s, attempt):
        raise HTTPException(status.HTTP_409_CONFLICT, f"attempt {attempt.id} is no longer its job's current attempt")
    changed = repo.set_checkpoint_state(s, attempt.job, [body.uri], "bad", body.reason)
    return CheckpointStateOut(changed=[c.uri for c in changed])


@jobs.post("/{job_ref}/checkpoints/state", response_model=CheckpointStateOut)
def set_state(s: SessionDep, job_ref: str, body: CheckpointStateIn, who: WriterDep) -> CheckpointStateOut:
    """Mark recorded checkpoints `bad` (verification failed) or `deleted` (GC removed them).
    Unknown URIs and ones already in that state are left alone, so a redelivery changes nothing."""
    changed = repo.set_checkpoint_state(s, job_of(s, who, job_ref), body.uris, body.state, body.reason)
    return CheckpointStateOut(changed=[c.uri for c in changed])
