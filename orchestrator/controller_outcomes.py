"""A poll's result into the store: node rows, the handle, and how the attempt and its job end.

What the agents reported of their own exits (POST .../exit, with "t") outranks the backend's view,
and a stop nobody asked for is a failure. What a failed attempt means for its job is chaining's
call when it runs (the chain_restart handler reacts to the attempt's Failed event).
"""

from __future__ import annotations

import dataclasses
import logging

from aerie_contracts.events import DetailType
from aerie_contracts.failures import FailureKind, stop_limit
from aerie_contracts.preflight import HANDLE_SPARE_PREFLIGHT
from aerie_contracts.states import AttemptState, JobState
from orchestrator.backends.base import PollResult, first_reported_cause
from orchestrator.controller_limits import stop_reason
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt

log = logging.getLogger("aerie.controller")


def record_poll(db: Database, attempt_id: str, result: PollResult, chaining: bool) -> None:
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        if result.handle is not None:
            # The backend learned where the attempt runs, or replaced a dead spare; the spares'
            # own pre-flight results (posted by the spares, not the backend's) are kept.
            kept = (attempt.handle or {}).get(HANDLE_SPARE_PREFLIGHT)
            handle = {**result.handle, **({HANDLE_SPARE_PREFLIGHT: kept} if kept else {})}
            if handle != attempt.handle:
                attempt.handle = handle
        # What the agents reported themselves (POST .../exit, with "t") outranks the backend's view.
        reported = {n.host: n.exit for n in attempt.nodes if "t" in (n.exit or {})}
        for node in result.nodes:
            row = repo.node(s, attempt, node.host)
            row.state = node.state
            if (node.exit_code is not None or node.reason) and node.host not in reported:
                row.exit = {"exit_code": node.exit_code, "reason": node.reason}
        if not result.terminal:
            return
        rows = repo.verdicts_of(s, [attempt.id])
        verdicts = [{"kind": v.kind, "message": v.message, "host": v.host, "t": v.t} for v in rows]
        result = first_reported_cause(result, reported, verdicts)
        job = attempt.job
        if result.state == AttemptState.STOPPED and not job.stop_requested and stop_limit(result.reason):
            job.reason = dict(result.reason or {})  # SageMaker stopped it for its StoppingCondition
        elif result.state == AttemptState.STOPPED and not job.stop_requested:
            # Nodes that stopped without being asked to have failed, as far as the job is concerned.
            result = PollResult(
                AttemptState.FAILED,
                result.nodes,
                {"kind": FailureKind.NODE_LOST, "message": "nodes stopped unexpectedly"},
            )
        if result.state == AttemptState.STOPPED and stop_limit(job.reason):
            # Its agents only know they were asked to stop (user.stop): the attempt says why.
            result = dataclasses.replace(result, reason=stop_reason(job))
        repo.set_attempt_state(s, attempt, result.state, result.reason, result.exit_code)
        if result.state == AttemptState.COMPLETED:
            repo.set_job_state(s, job, JobState.COMPLETED)
        elif result.state == AttemptState.STOPPED:
            repo.set_job_state(s, job, JobState.STOPPED, stop_reason(job))
        else:
            attempt_failed(s, attempt, result.reason or {"kind": FailureKind.EXIT_NONZERO}, chaining)


def attempt_failed(s, attempt: Attempt, reason: dict, chaining: bool) -> None:
    job = attempt.job
    if job.stop_requested:
        repo.set_job_state(s, job, JobState.STOPPED, stop_reason(job))
    elif not chaining:
        repo.set_job_state(s, job, JobState.FAILED, reason)
    # else: the chaining handler reacts to the attempt's Failed event and decides.


def spares_replaced(db: Database, attempt_id: str, result: PollResult) -> None:
    """The backend replaced hot spares that died while they waited: an event for each (the
    attempt's new handle is stored by `record_poll`)."""
    with db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        for dead, new in result.spares_replaced.items():
            why = f"hot spare {dead} died while it waited" + (f"; {new} started" if new else "; no free node")
            log.warning("%s: %s", attempt_id, why)
            detail = {"attempt_id": attempt.id, "attempt": attempt.number, "host": dead, "replacement": new}
            repo.emit(s, attempt.job, DetailType.SPARE_REPLACED, {**detail, "why": why})


def reported_exits(db: Database, attempt_id: str) -> dict[str, dict]:
    """What the attempt's agents reported of their own exits (POST .../exit, with "t")."""
    with db.session() as s:
        return {n.host: n.exit for n in repo.get_attempt(s, attempt_id).nodes if "t" in (n.exit or {})}
