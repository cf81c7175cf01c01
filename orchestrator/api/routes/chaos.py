"""`POST /v1/jobs/{job}/chaos`: a fault done from the outside to one real rank, or to a whole node
(its NIC slowed; the node lost, on the local backend).

Any trainer can be rehearsed without code of its own: the request goes to the node's agent through
the backend (`Backend.chaos`; the local backend drops it in the node's directory), the agent acts on
the rank's real pid (agent/chaos.py). Every request is audited as an `Aerie Chaos Injected` event in
the same transaction, so it shows in the job's events and reaches the event bus.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from aerie_contracts import byo
from aerie_contracts.events import DetailType
from aerie_contracts.states import AttemptState
from orchestrator.api.deps import SessionDep, WriterDep
from orchestrator.api.schemas import AUTH_ERRORS, ErrorOut
from orchestrator.store import repo

router = APIRouter(
    prefix="/v1/jobs",
    tags=["chaos"],
    responses={**AUTH_ERRORS, 409: {"model": ErrorOut, "description": "The job has no running attempt to fault"}},
)


class ChaosIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: int = Field(ge=0, le=4095, description="the node's rank in the attempt (0 = the first host)")
    rank: int | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="the global rank on that node (sigstop, sigkill, freeze)",
    )
    fault: Literal["sigstop", "sigkill", "freeze", "slow-nic", "node-loss"]  # aerie_contracts.byo.CHAOS_FAULTS


class ChaosOut(BaseModel):
    id: str
    attempt_id: str
    host: str
    rank: int | None
    fault: str


@router.post("/{job_ref}/chaos", response_model=ChaosOut, responses={404: {"model": ErrorOut}})
def chaos(s: SessionDep, request: Request, job_ref: str, body: ChaosIn, who: WriterDep) -> ChaosOut:
    try:
        job = repo.get_job(s, who.tenant, job_ref)
    except repo.NotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_ref!r}") from None
    attempt = job.attempts[-1] if job.attempts else None
    if attempt is None or attempt.state != AttemptState.RUNNING or not attempt.handle:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job.name} has no running attempt")
    hosts = list(attempt.handle.get("hosts") or [])
    procs = int(((job.spec or {}).get("resources") or {}).get("procs_per_node", 1))
    if body.node >= len(hosts):
        raise HTTPException(status.HTTP_409_CONFLICT, f"the attempt has {len(hosts)} node(s)")
    if body.fault in byo.RANK_FAULTS and body.rank is None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"{body.fault} is done to one rank: name it (rank)")
    if body.rank is not None and body.rank // procs != body.node:
        raise HTTPException(status.HTTP_409_CONFLICT, f"rank {body.rank} does not run on node {body.node}")
    backend = request.app.state.backends.get(job.backend)
    host = hosts[body.node]
    req = {"id": uuid.uuid4().hex[:12], "rank": body.rank, "fault": body.fault, "t": time.time()}
    try:
        backend.chaos(attempt.handle, host, req)
    except (NotImplementedError, ValueError, OSError) as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    detail = {"attempt_id": attempt.id, "host": host, "rank": body.rank, "fault": body.fault, "request_id": req["id"]}
    repo.emit(s, job, DetailType.CHAOS_INJECTED, {**detail, "by": f"{who.kind}:{who.token_id}"})
    return ChaosOut(id=req["id"], attempt_id=attempt.id, host=host, rank=body.rank, fault=body.fault)
