"""The one read model of jobs and attempts: what the API returns and the dashboard shows.

Both `api/routes/jobs.py` and `web/views.py` build their views of a job from these functions, so
a field (steps redone, time to resume) is computed once and means the same on both.
"""

from __future__ import annotations

from aerie_contracts.checkpoints import step_of_uri
from orchestrator.api.schemas import AttemptOut, NodeOut
from orchestrator.store.models import Attempt, Job


def job_out(job: Job, with_spec: bool = False) -> dict:
    return dict(
        id=job.id,
        name=job.name,
        tenant=job.tenant,
        state=job.state,
        backend=job.backend,
        reason=job.reason,
        created_at=job.created_at,
        updated_at=job.updated_at,
        ended_at=job.ended_at,
        attempts=len(job.attempts),
        spec=job.spec if with_spec else None,
    )


def last_step(a: Attempt) -> int | None:
    steps = [n.summary.get("last_step") for n in a.nodes if n.summary and n.summary.get("last_step") is not None]
    return max(steps) if steps else None


def attempt_out(a: Attempt, previous: Attempt | None = None) -> AttemptOut:
    """An attempt, with what the chain cost: steps redone and time from failure to resume."""
    resumed = step_of_uri(a.resume_from)
    prev_last = last_step(previous) if previous else None
    return AttemptOut(
        id=a.id,
        number=a.number,
        state=a.state,
        reason=a.reason,
        exit_code=a.exit_code,
        resume_from=a.resume_from,
        exclude_nodes=list(a.exclude_nodes or []),
        cause=a.cause,
        last_step=last_step(a),
        resumed_step=resumed,
        steps_lost=(prev_last - (resumed or 0)) if previous and prev_last is not None else None,
        time_to_resume_s=(a.started_at - previous.ended_at)
        if previous and a.started_at and previous.ended_at
        else None,
        created_at=a.created_at,
        started_at=a.started_at,
        ended_at=a.ended_at,
        nodes=[
            NodeOut(host=n.host, state=n.state, last_heartbeat_at=n.last_heartbeat_at, summary=n.summary, exit=n.exit)
            for n in a.nodes
        ],
    )


def attempts_out(job: Job) -> list[AttemptOut]:
    return [attempt_out(a, job.attempts[i - 1] if i else None) for i, a in enumerate(job.attempts)]
