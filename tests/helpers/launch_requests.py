"""The backend's launch request for one attempt of a job, for backend tests without a control plane."""

from __future__ import annotations

from typing import Any

from orchestrator.backends.base import LaunchRequest
from orchestrator.spec import JobSpec


def attempt_request(spec: JobSpec, number: int = 1, job_id: str | None = None, **fields: Any) -> LaunchRequest:
    """Attempt `number` of job `job_id` (`<name>-abc` unless given) whose spec is `spec`; `fields`:
    LaunchRequest's others (the API's address and the agent's token have stand-ins)."""
    job_id = job_id or f"{spec.name}-abc"
    agent = {"api_url": "http://127.0.0.1:8470", "agent_token": "tok"}
    return LaunchRequest(
        job_id=job_id,
        job_name=spec.name,
        attempt_id=f"{job_id}-a{number}",
        attempt_number=number,
        spec=spec,
        **{**agent, **fields},
    )


def launch_request(number: int, spec: dict[str, Any], retry: dict | None = None, **fields: Any) -> LaunchRequest:
    """`attempt_request` of a job whose spec is `spec` running `python train.py` with `retry` (two
    restarts unless given)."""
    job = JobSpec.model_validate({"entrypoint": ["python", "train.py"], **spec, "retry": retry or {"max_restarts": 2}})
    return attempt_request(job, number, **fields)
