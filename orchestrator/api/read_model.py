"""The one read model of jobs and attempts: what the API returns and the dashboard shows.

Both `api/routes/jobs.py` and `web/views.py` build their views of a job from these functions, so
a field (steps redone, time to resume) is computed once and means the same on both.
"""

from __future__ import annotations

from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.preflight import HANDLE_SPARE_PREFLIGHT
from orchestrator.api.schemas import AttemptOut, NodeOut
from orchestrator.store.models import Attempt, Job, columns


def job_out(job: Job, with_spec: bool = False) -> dict:
    copied = columns(job, "id", "name", "tenant", "state", "backend", "reason", "created_at", "updated_at", "ended_at")
    return dict(**copied, attempts=len(job.attempts), spec=job.spec if with_spec else None)


def last_step(a: Attempt) -> int | None:
    steps = [n.summary.get("last_step") for n in a.nodes if n.summary and n.summary.get("last_step") is not None]
    return max(steps) if steps else None


def attempt_out(a: Attempt, previous: Attempt | None = None) -> AttemptOut:
    """An attempt, with what the chain cost: steps redone and time from failure to resume."""
    resumed = step_of_uri(a.resume_from)
    prev_last = last_step(previous) if previous else None
    return AttemptOut(
        **columns(a, "id", "number", "state", "reason", "exit_code", "resume_from", "cause"),
        **columns(a, "created_at", "started_at", "ended_at"),
        exclude_nodes=list(a.exclude_nodes or []),
        last_step=last_step(a),
        resumed_step=resumed,
        steps_lost=(prev_last - (resumed or 0)) if previous and prev_last is not None else None,
        time_to_resume_s=(a.started_at - previous.ended_at)
        if previous and a.started_at and previous.ended_at
        else None,
        nodes=[
            NodeOut(**columns(n, "host", "state", "last_heartbeat_at", "summary", "exit", "preflight")) for n in a.nodes
        ],
        spares=[str(h) for h in (a.handle or {}).get("spares") or []],
        spare_preflight=dict((a.handle or {}).get(HANDLE_SPARE_PREFLIGHT) or {}),
    )


def attempts_out(job: Job) -> list[AttemptOut]:
    return [attempt_out(a, job.attempts[i - 1] if i else None) for i, a in enumerate(job.attempts)]
