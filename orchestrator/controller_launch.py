"""What an attempt is launched with, rebuilt from the store whenever it is needed.

The request is never stored (it holds a freshly minted agent token), so one recipe serves both the
launch and a restarted control plane that hands a running attempt back to its backend (`adopt`).
"""

from __future__ import annotations

import dataclasses
import time

from aerie_contracts.restarts import CAUSE_REPLACED_NODES, RestartMode, mode_of
from orchestrator.backends.base import Backend, LaunchRequest
from orchestrator.backends.nodeenv import memory_resume_env
from orchestrator.goodput.advice import checkpoint_mtbf_env
from orchestrator.learned import learned_env
from orchestrator.settings import Settings
from orchestrator.spec import JobSpec
from orchestrator.store import repo
from orchestrator.store.models import Attempt, Job


def launch_request(s, settings: Settings, job: Job, attempt: Attempt) -> LaunchRequest:
    """What `attempt` is launched with, from the store, with an agent token minted for it: one
    recipe for its launch and for the backend of a restarted control plane that adopts it
    running (`Controller._adopt`), whose request is never stored (the token). An in-place attempt
    names the failed one's handle; which spares a relaunch keeps is its launch's own business."""
    token = repo.mint_token(s, "agent", tenant=job.tenant, attempt_id=attempt.id, name=f"agent for {attempt.id}")
    request = LaunchRequest(
        job_id=job.id,
        job_name=job.name,
        attempt_id=attempt.id,
        attempt_number=attempt.number,
        spec=JobSpec.model_validate(job.spec),
        api_url=settings.api_url,
        agent_token=token,
        resume_from=attempt.resume_from,
        exclude_nodes=tuple(attempt.exclude_nodes or ()),
        # What earlier attempts learned about section durations (learned timeouts).
        extra_env={
            **learned_env(job, attempt.number),
            **memory_resume_env(attempt.cause),
            **checkpoint_mtbf_env(s, job, time.time()),  # for checkpoint.every_steps: auto
        },
    )
    previous = previous_handle(job, attempt)
    if mode_of(attempt.cause) == RestartMode.IN_PLACE and previous is not None:
        swaps = (attempt.cause or {}).get(CAUSE_REPLACED_NODES) or {}
        replaced = {str(k): str(v) for k, v in swaps.items()}
        request = dataclasses.replace(request, in_place_of=previous, replace_nodes=replaced)
    return request


def previous_handle(job: Job, attempt: Attempt) -> dict | None:
    """The handle of the attempt before `attempt` (whose nodes an in-place attempt reuses)."""
    previous = next((a for a in job.attempts if a.number == attempt.number - 1), None)
    return previous.handle if previous is not None else None


def waiting_spares(backend: Backend, handle: dict) -> dict[str, dict[str, str]]:
    """The hot spares of a failed local attempt, for the relaunch to keep ({host: {"root": the
    folder their tree is under, "peer": their memory-tier endpoint}}); the backend checks they live."""
    if not getattr(backend, "keeps_spares", False):
        return {}
    roots, peers = handle.get("node_roots") or {}, handle.get("memory_peers") or {}
    return {
        h: {"root": str(roots.get(h) or handle["root"]), "peer": str(peers.get(h) or "")}
        for h in handle.get("spares") or []
    }
