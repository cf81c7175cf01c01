"""Nodes of an attempt: heartbeats, verdicts, and the blame that excludes a node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aerie_contracts import DetailType
from aerie_contracts.failures import FailureKind
from aerie_contracts.preflight import HANDLE_SPARE_PREFLIGHT, Decision, failed_checks, summary_line
from aerie_contracts.states import ATTEMPT_TERMINAL, JOB_TERMINAL, NodeState
from orchestrator.store.models import (
    Attempt,
    Job,
    Node,
    NodeBlame,
    Verdict,
    now,
)
from orchestrator.store.repo.outbox import emit

# --- nodes and verdicts -----------------------------------------------------------------------------


def node(s: Session, attempt: Attempt, host: str) -> Node:
    row = s.get(Node, (attempt.id, host))
    if row is None:
        row = Node(attempt_id=attempt.id, host=host, state=NodeState.STARTING)
        s.add(row)
    return row


def record_heartbeat(s: Session, attempt: Attempt, host: str, summary: dict[str, Any]) -> Node:
    row = node(s, attempt, host)
    row.last_heartbeat_at = now()
    row.summary = summary
    if row.state == NodeState.STARTING:
        row.state = NodeState.RUNNING
    return row


def record_verdict(
    s: Session, attempt: Attempt, host: str, kind: str, message: str, evidence: dict[str, Any]
) -> Verdict:
    verdict = Verdict(attempt_id=attempt.id, host=host, kind=kind, message=message, evidence=evidence)
    s.add(verdict)
    emit(
        s,
        attempt.job,
        DetailType.VERDICT_RAISED,
        {
            "attempt_id": attempt.id,
            "attempt": attempt.number,
            "host": host,
            "kind": kind,
            "message": message,
        },
    )
    return verdict


def record_preflight(s: Session, attempt: Attempt, host: str, result: dict[str, Any]) -> Node:
    """A node's pre-flight result: stored on its row, emitted (`Aerie Preflight Checked`), and a
    failed one also recorded as that node's `preflight.failed` verdict, the evidence chaining
    blames it by. A node reports once per attempt; a repeated report replaces the stored one."""
    from sqlalchemy.exc import IntegrityError

    row = s.get(Node, (attempt.id, host))
    if row is None:
        try:
            with s.begin_nested():  # the heartbeat buffer's flush may insert the row meanwhile
                row = node(s, attempt, host)
        except IntegrityError:
            row = s.get(Node, (attempt.id, host), populate_existing=True)
            assert row is not None
    first = row.preflight is None
    row.preflight = result
    if not first:
        return row
    if not _emit_checked(s, attempt, host, result):
        record_verdict(
            s, attempt, host, FailureKind.PREFLIGHT_FAILED, f"pre-flight {summary_line(result)}", {"preflight": result}
        )
    return row


def record_spare_preflight(s: Session, attempt: Attempt, host: str, result: dict[str, Any]) -> None:
    """A hot spare's own pre-flight, run alone while it waits: a node of no attempt yet, so no node
    row (the attempt's decision and nodes are its ranked nodes'), no verdict (the attempt goes on; a
    spare that failed never takes a slot), but kept in the attempt's handle for the API and
    `aerie describe`, and emitted as every node's result is."""
    handle = dict(attempt.handle or {})
    handle[HANDLE_SPARE_PREFLIGHT] = {**(handle.get(HANDLE_SPARE_PREFLIGHT) or {}), host: result}
    attempt.handle = handle  # a new dict: the JSON column sees the change
    _emit_checked(s, attempt, host, result, spare=True)


def preflight_decision(attempt: Attempt) -> tuple[Decision, str, list[str]]:
    """The attempt's pre-flight decision from its nodes' results: (decision, why, failed hosts)."""
    job = attempt.job
    if job.stop_requested or job.state in JOB_TERMINAL or attempt.state in ATTEMPT_TERMINAL:
        return Decision.ABORT, f"attempt {attempt.state}", []
    results = {n.host: n.preflight for n in attempt.nodes if n.preflight is not None}
    failed = sorted(h for h, r in results.items() if not r.get("passed") or failed_checks(r))
    if failed:
        return Decision.ABORT, f"pre-flight failed on {', '.join(failed)}", failed
    hosts = list((attempt.handle or {}).get("hosts") or [])
    missing = [h for h in hosts if h not in results]
    if not hosts or missing:
        return Decision.WAIT, f"waiting for {', '.join(missing) or 'the launch'}", []
    return Decision.START, f"every node passed ({len(hosts)})", []


def verdicts_of(s: Session, attempt_ids: list[str]) -> Sequence[Verdict]:
    return s.scalars(select(Verdict).where(Verdict.attempt_id.in_(attempt_ids)).order_by(Verdict.t)).all()


# --- node blame -------------------------------------------------------------------------------------


def record_blames(s: Session, attempt: Attempt, blames: list[dict[str, Any]]) -> None:
    """Chaining's blame of nodes for a failed attempt (`aerie_contracts.failures.NodeBlame` dicts).
    A host already blamed for this attempt keeps its first row: a redelivered failure counts once."""
    from sqlalchemy.exc import IntegrityError

    for b in blames:
        taken = select(NodeBlame.id).where(NodeBlame.attempt_id == attempt.id, NodeBlame.host == b["host"])
        if s.scalars(taken).first() is not None:
            continue
        row = NodeBlame(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            host=b["host"],
            kind=b["kind"],
            rule=b["rule"],
            why=b.get("why", ""),
            evidence=b.get("evidence") or {},
        )
        try:
            with s.begin_nested():
                s.add(row)
        except IntegrityError:  # a concurrent delivery recorded it first
            pass


def blames_of(s: Session, job: Job) -> Sequence[NodeBlame]:
    return s.scalars(select(NodeBlame).where(NodeBlame.job_id == job.id).order_by(NodeBlame.id)).all()


def clear_blames(s: Session, job: Job, host: str, by: str) -> int:
    """The node proved itself again: its blames in this job stop counting towards exclusion, and
    stay as history. Returns how many were cleared. (Not called by pre-flight: passing its checks
    is too weak to forgive a node that hung a job; hot spares may re-admit excluded nodes with it.)"""
    rows = [b for b in blames_of(s, job) if b.host == host and b.cleared_at is None]
    for b in rows:
        b.cleared_at, b.cleared_by = now(), by
    return len(rows)


def _emit_checked(s: Session, attempt: Attempt, host: str, result: dict[str, Any], *, spare: bool = False) -> bool:
    """The `Aerie Preflight Checked` event of one node's (or a spare's) result; whether it passed."""
    failed = [str(c.get("check")) for c in failed_checks(result)]
    passed = bool(result.get("passed")) and not failed
    detail = {"attempt_id": attempt.id, "attempt": attempt.number, "host": host, "passed": passed}
    emit(
        s,
        attempt.job,
        DetailType.PREFLIGHT_CHECKED,
        {**detail, "elapsed_s": result.get("elapsed_s"), "failed": failed, "summary": summary_line(result)}
        | ({"spare": True} if spare else {}),
    )
    return passed
