"""The reconcile pass's stop steps: StoppingCondition limits, and stop requests carried out.

A limit that runs out stops a job the way a user's stop does (`stop_requested`), so one path ends
both; the limit's reason stays on the job, and is what the attempt and the job end with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from aerie_contracts.failures import STOPPED_ON_REQUEST, FailureKind, FailureReason, stop_limit
from aerie_contracts.states import ATTEMPT_ACTIVE, AttemptState, JobState
from orchestrator import stopping
from orchestrator.backends.base import Backend
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Job

log = logging.getLogger("aerie.controller")


def stopped_on_request() -> FailureReason:
    """The reason of a job or attempt the user stopped (a fresh dict: reasons are stored as is)."""
    return {"kind": FailureKind.USER_STOP, "message": STOPPED_ON_REQUEST}


def stop_reason(job: Job) -> FailureReason:
    """Why a job that ends Stopped stopped: the StoppingCondition limit that ran out
    (`enforce_stopping` left it on the job), else the user's request."""
    return cast(FailureReason, dict(job.reason or {})) if stop_limit(job.reason) else stopped_on_request()


def enforce_stopping(db: Database) -> None:
    """StoppingCondition (orchestrator/stopping.py): a job over its max_runtime_s or max_wait_s
    is stopped the way a user's stop stops it (`stop_requested`, handled next), with the
    limit's reason on the job; decided once (a stopping job is not looked at again, so a user's
    stop before or after it changes nothing). Not on the sagemaker backend: SageMaker enforces
    the training job's StoppingCondition itself, and its poll reports the same reasons."""
    now = time.time()
    with db.session() as s:
        for state in (JobState.SUBMITTED, JobState.IN_PROGRESS):
            for job in repo.list_jobs_in_state(s, state):
                if job.stop_requested or job.backend == "sagemaker":
                    continue
                spans = [(a.started_at, a.ended_at) for a in job.attempts]
                why = stopping.exceeded(job.spec.get("stopping"), job.created_at, spans, now)
                if why is None:
                    continue
                log.warning("job %s: %s: stopping it", job.id, why["message"])
                job.reason = why
                job.stop_requested = True


def handle_stop_requests(db: Database, backend_of: Callable[[Job], Backend]) -> None:
    """A stopping job's running attempts are stopped through their backend (their poll records
    the end); its other live attempts are Stopped at once, and the job once none is launching or
    running."""
    with db.session() as s:
        for job in repo.jobs_stopping(s):
            live = [a for a in job.attempts if a.state in ATTEMPT_ACTIVE]
            for attempt in live:
                if attempt.state == AttemptState.RUNNING and attempt.handle:
                    backend_of(job).stop(attempt.handle)
                else:
                    repo.set_attempt_state(s, attempt, AttemptState.STOPPED)
            if not any(a.state in {AttemptState.LAUNCHING, AttemptState.RUNNING} for a in job.attempts):
                repo.set_job_state(s, job, JobState.STOPPED, stop_reason(job))
