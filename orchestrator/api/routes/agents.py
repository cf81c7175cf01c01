"""What node agents report: heartbeats, verdicts, pre-flight results, exits and committed
checkpoints; whether a node that passed pre-flight may start its ranks; and what an agent whose
worker group ended does next (an in-place restart, or nothing).

Each call is authorised for one attempt (`agent_of`): an agent token minted for attempt A is
refused on attempt B, so a compromised node can't speak for another job.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, HTTPException, Request, status

from aerie_contracts import memckpt
from aerie_contracts.preflight import Decision
from aerie_contracts.restarts import (
    CAUSE_MEMORY_NODES,
    CAUSE_RESUME_FALLBACK,
    LEFT_OUT,
    NextAction,
    RestartMode,
    mode_of,
)
from aerie_contracts.states import ATTEMPT_TERMINAL, JOB_TERMINAL, AttemptState
from orchestrator.api.deps import AgentDep, AttemptDep, SessionDep
from orchestrator.api.routes import checkpoints
from orchestrator.api.schemas import (
    AUTH_ERRORS,
    CheckpointIn,
    ExitIn,
    HeartbeatOut,
    MetricsIn,
    NextOut,
    PreflightIn,
    PreflightOut,
    VerdictIn,
)
from orchestrator.store import repo

router = APIRouter(prefix="/v1/attempts/{attempt_id}/nodes/{host}", tags=["agents"], responses=AUTH_ERRORS)


def store_heartbeat(state, attempt_id: str, host: str, summary: dict[str, Any]) -> None:
    """What accepting a heartbeat means, for this route and for the fast path (api/fastpath.py):
    the summary, a JSON object stored as sent (size capped by the middleware), goes to the flush
    buffer and to the dashboard's bounded health history."""
    state.heartbeats.add(attempt_id, host, summary)
    state.node_history.add(attempt_id, host, summary)


@router.post("/heartbeat", response_model=HeartbeatOut)
async def heartbeat(
    request: Request,
    attempt_id: str,
    host: str,
    who: AgentDep,
    body: dict[str, Any] = Body(..., openapi_examples={"summary": {"value": {"t": 1.0, "last_step": 10}}}),
) -> HeartbeatOut:
    """Buffered: no transaction of its own (see orchestrator/heartbeats.py); async because the
    cached path does no I/O (a cache miss runs one short query)."""
    buffer = request.app.state.heartbeats
    info = buffer.cached_info(attempt_id) or await request.app.state.lookups.run(
        ("attempt", attempt_id), buffer.attempt_info, attempt_id
    )
    if info is None or info.tenant != who.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt_id!r}")
    store_heartbeat(request.app.state, attempt_id, host, body)
    # The answer tells the agent to stop when nobody needs its work any more (backends that
    # cannot signal nodes directly rely on this), and which memory checkpoint its node must keep.
    return HeartbeatOut(stop=info.stop, memory_good_step=info.memory_good_step)


@router.post("/verdicts", status_code=status.HTTP_201_CREATED)
def verdict(s: SessionDep, attempt: AttemptDep, host: str, body: VerdictIn) -> dict:
    repo.record_verdict(s, attempt, host, body.kind, body.message, body.evidence)
    return {"ok": True}


@router.post("/preflight", response_model=PreflightOut)
def preflight(s: SessionDep, attempt: AttemptDep, host: str, body: PreflightIn) -> PreflightOut:
    """The node's pre-flight result (agent/preflight/): stored on its row, emitted as `Aerie
    Preflight Checked`, and, failed, recorded as its `preflight.failed` verdict. The answer is the
    attempt's decision so far (as `GET`). A hot spare's own result (`spare`) is kept apart: it is no
    node of the attempt yet (`repo.record_spare_preflight`)."""
    if (body.model_extra or {}).get("spare"):
        repo.record_spare_preflight(s, attempt, host, {**body.model_dump(), "host": host})
        return PreflightOut(action=Decision.WAIT, why=f"{host} is a hot spare: it waits for a slot")
    repo.record_preflight(s, attempt, host, {**body.model_dump(), "host": host})
    s.flush()
    return _decision(attempt)


@router.get("/preflight", response_model=PreflightOut)
def preflight_decision(s: SessionDep, attempt: AttemptDep, host: str) -> PreflightOut:
    """Asked by a node that passed, until every node of the attempt passed (`start`) or one failed
    or the attempt ended (`abort`: start no rank)."""
    return _decision(attempt)


def _decision(attempt) -> PreflightOut:
    action, why, failed = repo.preflight_decision(attempt)
    return PreflightOut(action=action, why=why, failed=failed)


@router.post("/exit")
def node_exit(s: SessionDep, attempt: AttemptDep, host: str, body: ExitIn) -> dict:
    row = repo.node(s, attempt, host)
    row.exit = {"exit_code": body.exit_code, "reason": body.reason, "t": body.t}
    return {"ok": True}


@router.post("/checkpoints", responses=checkpoints.SUPERSEDED)
def checkpoint(s: SessionDep, attempt: AttemptDep, host: str, body: CheckpointIn) -> dict:
    """A `checkpoint_committed` line of the node's metrics stream: recorded (fenced) as the
    trainer's own commit is (routes/checkpoints.py)."""
    return checkpoints.record(s, attempt, body)


@router.post("/metrics")
def metrics(s: SessionDep, attempt: AttemptDep, host: str, body: MetricsIn) -> dict:
    """Training-step records (rank 0) for the dashboard's curves; steps already stored are skipped."""
    return {"ok": True, "new": repo.record_metrics(s, attempt, body.records)}


@router.get("/next", response_model=NextOut)
def next_attempt(s: SessionDep, attempt: AttemptDep, host: str) -> NextOut:
    """Asked by an agent kept up after its worker group ended. Fencing: only the in-place
    successor of this very attempt, once launched on this node, is handed over, with a token
    scoped to it alone; this attempt's own token stays good for this attempt only, which is no
    longer current, so nothing its stale ranks commit is recorded."""
    answer = _next(s, attempt, host)
    latest = max(attempt.job.attempts, key=lambda a: a.number).number
    answer.attempt_over = attempt.state in ATTEMPT_TERMINAL or latest != attempt.number or attempt.job.stop_requested
    return answer


def _next(s, attempt, host: str) -> NextOut:
    job = attempt.job
    if job.stop_requested or job.state in JOB_TERMINAL:
        return NextOut(action=NextAction.EXIT, why=f"job {job.state}")
    latest = max(job.attempts, key=lambda a: a.number)
    if host in ((attempt.handle or {}).get("spares") or ()) or _replenished_by(attempt, latest, host):
        return _next_for_spare(s, attempt, latest, host)
    if latest.number == attempt.number:
        why = "no decision yet" if attempt.state in ATTEMPT_TERMINAL else f"attempt {attempt.state}"
        return NextOut(action=NextAction.WAIT, why=why)
    if latest.number != attempt.number + 1 or mode_of(latest.cause) != RestartMode.IN_PLACE:
        return NextOut(action=NextAction.EXIT, why=f"attempt {latest.number} is not this one's in-place successor")
    if latest.state in (AttemptState.PENDING, AttemptState.LAUNCHING) or not latest.handle:
        return NextOut(action=NextAction.WAIT, why=f"attempt {latest.number} {latest.state}")
    if latest.state in ATTEMPT_TERMINAL or host not in (latest.handle.get("hosts") or ()):
        return NextOut(action=NextAction.EXIT, why=f"attempt {latest.number} {LEFT_OUT} {host}")
    return _hand_over(s, latest, host)


def _replenished_by(attempt, latest, host: str) -> bool:
    """Whether `host` is a hot spare that `attempt` started but only a later attempt's handle
    names: a Slurm spare allocation (`spare_allocations`, each with the attempt that submitted it)
    whose nodes recorded themselves after that attempt's last poll, learned by its in-place
    successor's. Its agent still speaks with `attempt`'s token, so without this it would be sent
    home as a node the successor left out while the successor counts it as a spare."""
    if latest.number == attempt.number:
        return False
    allocations = (latest.handle or {}).get("spare_allocations") or ()
    return any(a.get("attempt_id") == attempt.id and host in (a.get("hosts") or ()) for a in allocations)


def _next_for_spare(s, attempt, latest, host: str) -> NextOut:
    """A hot spare (resources.spare_nodes) waits, whatever attempts come and go in place, until an
    in-place attempt gives it a rank slot (`restart`); a relaunch, which brings spares of its own,
    ends it. Its token is the attempt's it was launched with; the hand-over mints one for the
    attempt it joins."""
    if latest.number == attempt.number:
        return NextOut(action=NextAction.WAIT, why=f"{host} is a hot spare; attempt {attempt.number} {attempt.state}")
    if latest.state in (AttemptState.PENDING, AttemptState.LAUNCHING) or not latest.handle:
        return NextOut(action=NextAction.WAIT, why=f"attempt {latest.number} {latest.state}")
    handle = latest.handle
    in_place = mode_of(latest.cause) == RestartMode.IN_PLACE and latest.state not in ATTEMPT_TERMINAL
    if in_place and host in (handle.get("hosts") or ()):
        return _hand_over(s, latest, host)
    if host in (handle.get("spares") or ()):
        return NextOut(action=NextAction.WAIT, why=f"{host} is still a hot spare (attempt {latest.number})")
    return NextOut(action=NextAction.EXIT, why=f"attempt {latest.number} does not keep {host} as a spare")


def _hand_over(s, latest, host: str) -> NextOut:
    job = latest.job
    token = repo.mint_token(
        s, "agent", tenant=job.tenant, attempt_id=latest.id, name=f"agent for {latest.id} (in place on {host})"
    )
    return NextOut(
        action=NextAction.RESTART,
        attempt_id=latest.id,
        attempt_number=latest.number,
        token=token,
        resume_from=latest.resume_from,
        resume_fallback=(latest.cause or {}).get(CAUSE_RESUME_FALLBACK),
        memory_nodes=(latest.cause or {}).get(CAUSE_MEMORY_NODES),
        master_port=latest.handle.get("master_port"),
        master_addr=latest.handle.get("master_addr") or None,
        memckpt_key=latest.handle.get(memckpt.HANDLE_KEY),
        hosts=list(latest.handle.get("hosts") or []) or None,
        memory_peers=latest.handle.get("memory_peers") or None,
    )
