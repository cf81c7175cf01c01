"""Jobs: submit, list, describe, stop, and what they produced (attempts, events, logs, checkpoints)."""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from aerie_contracts.states import JOB_TERMINAL, AttemptState, JobState
from orchestrator.api.deps import SessionDep, UserDep, WriterDep, job_of
from orchestrator.api.read_model import attempt_out, attempts_out, job_out
from orchestrator.api.routes.checkpoints import checkpoint_out
from orchestrator.api.schemas import (
    AUTH_ERRORS,
    MAX_DB_INT,
    AttemptOut,
    BlameOut,
    BlamesIn,
    CheckpointOut,
    ErrorOut,
    EventOut,
    FailIn,
    JobDetail,
    JobOut,
    LogsOut,
    RestartIn,
    VerdictOut,
)
from orchestrator.spec import JobSpec
from orchestrator.store import repo
from orchestrator.store.models import Job, columns

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    responses={**AUTH_ERRORS, 409: {"model": ErrorOut, "description": "Conflicts with the job's state"}},
)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def submit(s: SessionDep, spec: JobSpec, who: WriterDep) -> dict:
    """Submit a job. The spec is validated whole: a 422 names every bad field."""
    job = repo.create_job(s, spec.model_dump(mode="json"), who.tenant)
    return job_out(job, with_spec=True)


@router.get("", response_model=list[JobOut])
def list_jobs(
    s: SessionDep,
    who: UserDep,
    state: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_DB_INT),
) -> list[dict]:
    return [job_out(j) for j in repo.list_jobs(s, who.tenant, state, limit, offset)]


@router.get("/{job_ref}", response_model=JobDetail)
def describe(s: SessionDep, job_ref: str, who: UserDep) -> dict:
    job = job_of(s, who, job_ref)
    verdicts = repo.verdicts_of(s, [a.id for a in job.attempts])
    return dict(
        **job_out(job, with_spec=True),
        attempt_list=attempts_out(job),
        verdicts=[
            VerdictOut(attempt_id=v.attempt_id, host=v.host, kind=v.kind, message=v.message, t=v.t, evidence=v.evidence)
            for v in verdicts
        ],
        blames=blames_out(s, job),
    )


def blames_out(s: Session, job: Job) -> list[BlameOut]:
    return [
        BlameOut(
            **columns(b, "attempt_id", "host", "kind", "rule", "why", "created_at", "cleared_at", "cleared_by"),
            evidence=b.evidence or {},
        )
        for b in repo.blames_of(s, job)
    ]


@router.post("/{job_ref}/stop", response_model=JobOut)
def stop(s: SessionDep, job_ref: str, who: WriterDep) -> dict:
    """Ask for the job to stop; the controller stops its running attempt (idempotent)."""
    job = job_of(s, who, job_ref)
    if job.state not in JOB_TERMINAL:
        job.stop_requested = True
    return job_out(job)


@router.post("/{job_ref}/attempts", status_code=status.HTTP_201_CREATED, response_model=AttemptOut)
def restart(s: SessionDep, job_ref: str, body: RestartIn, who: WriterDep) -> AttemptOut:
    """Create attempt N+1 after attempt N failed (what chaining calls). 409 if it exists already:
    the store's (job, number) constraint makes a duplicated restart decision harmless."""
    job = job_of(s, who, job_ref)
    if job.state in JOB_TERMINAL or job.stop_requested:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job is {job.state}; nothing to restart")
    latest = job.attempts[-1] if job.attempts else None
    if latest is None or body.number != latest.number + 1 or latest.state != AttemptState.FAILED:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"attempt {body.number} can only follow a failed attempt {body.number - 1}"
        )
    try:
        with s.begin_nested():
            attempt = repo.create_attempt(s, job, body.number, body.resume_from, body.exclude_nodes)
            attempt.cause = body.cause
    except IntegrityError:
        raise HTTPException(status.HTTP_409_CONFLICT, f"attempt {body.number} exists already") from None
    return attempt_out(attempt)


@router.post("/{job_ref}/attempts/{number}/blames", response_model=list[BlameOut])
def blame(
    s: SessionDep,
    job_ref: str,
    body: BlamesIn,
    who: WriterDep,
    number: int = Path(ge=1, le=MAX_DB_INT),
) -> list[BlameOut]:
    """Record the nodes chaining blamed for failed attempt `number` (idempotent: a host already
    blamed for it keeps its first record). Answers every blame of the job, cleared ones included."""
    job = job_of(s, who, job_ref)
    attempt = next((a for a in job.attempts if a.number == number), None)
    if attempt is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job.id} has no attempt {number}")
    if attempt.state != AttemptState.FAILED:
        raise HTTPException(status.HTTP_409_CONFLICT, f"attempt {number} is {attempt.state}; only failed ones are")
    repo.record_blames(s, attempt, [b.model_dump() for b in body.blames])
    s.flush()
    return blames_out(s, job)


@router.post("/{job_ref}/fail", response_model=JobOut)
def fail(s: SessionDep, job_ref: str, body: FailIn, who: WriterDep) -> dict:
    """End the job as Failed (chaining decided not to retry). Idempotent."""
    job = job_of(s, who, job_ref)
    if job.state not in JOB_TERMINAL:
        repo.set_job_state(s, job, JobState.FAILED, body.reason)
    return job_out(job)


@router.get("/{job_ref}/attempts", response_model=list[AttemptOut])
def attempts(s: SessionDep, job_ref: str, who: UserDep) -> list[AttemptOut]:
    return attempts_out(job_of(s, who, job_ref))


@router.get("/{job_ref}/events", response_model=list[EventOut])
def events(
    s: SessionDep,
    job_ref: str,
    who: UserDep,
    after: int = Query(0, ge=0, le=MAX_DB_INT, description="Only events with seq > after"),
    limit: int = Query(1000, ge=1, le=10000),
) -> list[EventOut]:
    job = job_of(s, who, job_ref)
    return [
        EventOut(seq=e.seq, status=e.status, deliveries=e.deliveries, event=repo.eventbridge(e))
        for e in repo.list_events(s, job, after=after, limit=limit)
    ]


@router.get("/{job_ref}/checkpoints", response_model=list[CheckpointOut])
def checkpoints(
    s: SessionDep,
    job_ref: str,
    who: UserDep,
    limit: int = Query(1000, ge=1, le=10000),
    offset: int = Query(0, ge=0, le=MAX_DB_INT),
) -> list[CheckpointOut]:
    job = job_of(s, who, job_ref)
    return [checkpoint_out(c) for c in repo.list_checkpoints(s, job)[offset : offset + limit]]


@router.get("/{job_ref}/logs", response_model=LogsOut)
def logs(
    s: SessionDep,
    request: Request,
    job_ref: str,
    who: UserDep,
    attempt: int | None = Query(None, ge=1, le=MAX_DB_INT),
    offsets: str | None = Query(None, description='JSON {"host": byte offset}; negative = last N bytes'),
    tail: int | None = Query(
        None, ge=1, le=MAX_DB_INT, description="Without offsets: only the last TAIL bytes of each node"
    ),
) -> LogsOut:
    """New output of every node of an attempt (the latest by default) since the given offsets."""
    job = job_of(s, who, job_ref)
    chosen = [a for a in job.attempts if attempt is None or a.number == attempt]
    if not chosen or not chosen[-1].handle:
        return LogsOut(attempt=chosen[-1].number if chosen else None, nodes={})
    try:
        parsed = {str(k): int(v) for k, v in json.loads(offsets).items()} if offsets else {}
        if any(abs(v) > MAX_DB_INT for v in parsed.values()):
            raise ValueError("offset out of range")
    except (ValueError, AttributeError, TypeError, OverflowError):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, 'offsets must be a JSON object {"host": int}') from None
    backend = request.app.state.backends.get(job.backend)
    if backend is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"backend {job.backend!r} is not configured here")
    if not parsed:
        parsed = {h: -tail if tail else 0 for h in chosen[-1].handle.get("hosts", [])}
    return LogsOut(attempt=chosen[-1].number, nodes=backend.logs(chosen[-1].handle, parsed))
