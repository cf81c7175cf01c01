"""The heartbeat path, built for thousands of nodes.

A heartbeat is small, frequent and only its newest value matters, so it must not cost a
transaction of its own. The API keeps the newest summary per (attempt, host) in memory and a
flusher writes all of them every `flush_s` in one transaction; the answer to the agent ("should
I stop?") comes from a short-lived cache of the attempt's state. Only the latest summary per
node is stored: the history window is bounded by construction. A crash loses at most `flush_s`
of heartbeats, which the next ones replace anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select

from aerie_contracts.checkpoints import CheckpointTier
from aerie_contracts.states import ATTEMPT_TERMINAL, CheckpointState, NodeState
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt, Checkpoint, Job, Node, now

log = logging.getLogger("aerie.heartbeats")


@dataclass(frozen=True)
class AttemptInfo:
    tenant: str
    stop: bool
    fetched_at: float
    memory_good_step: int | None = None  # the job's newest good memory checkpoint (HeartbeatOut)


def _memory_good_step():
    """The attempt's job's newest good memory checkpoint step, as a correlated scalar subquery."""
    return (
        select(func.max(Checkpoint.step))
        .where(
            Checkpoint.job_id == Attempt.job_id,
            Checkpoint.tier == CheckpointTier.MEMORY.value,
            Checkpoint.state == CheckpointState.GOOD.value,
        )
        .scalar_subquery()
    )


class HeartbeatBuffer:
    def __init__(self, db: Database, flush_s: float = 0.5, info_ttl_s: float = 2.0):
        self.db = db
        self.flush_s = flush_s
        self.info_ttl_s = info_ttl_s
        self._pending: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._info: dict[str, AttemptInfo] = {}
        self._last_used: dict[str, float] = {}  # attempt -> monotonic time of its last heartbeat
        self.forget_after_s = 60.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-flusher", daemon=True)
        self._thread.start()

    def cached_info(self, attempt_id: str) -> AttemptInfo | None:
        """The cached tenant and "should stop" of an attempt, however old: the flusher re-reads
        the attempts that sent heartbeats every `info_ttl_s`, so the request path (which runs on
        the event loop) never waits for the database once an attempt is known."""
        info = self._info.get(attempt_id)
        if info is not None:
            self._last_used[attempt_id] = time.monotonic()
        return info

    def attempt_info(self, attempt_id: str) -> AttemptInfo | None:
        """Cached, or read now (blocking: call it from a worker thread, not the event loop)."""
        info = self.cached_info(attempt_id)
        if info is not None:
            return info
        with self.db.session() as s:
            attempt = s.get(Attempt, attempt_id)
            if attempt is None:
                return None
            good = s.scalar(select(_memory_good_step()).where(Attempt.id == attempt_id))
            info = AttemptInfo(
                attempt.job.tenant,
                attempt.state in ATTEMPT_TERMINAL or attempt.job.stop_requested,
                time.monotonic(),
                good,
            )
        self._info[attempt_id] = info
        self._last_used[attempt_id] = info.fetched_at
        return info

    def refresh_info(self) -> None:
        """Re-read, in one query, the attempts whose cached info is older than `info_ttl_s` and
        that sent a heartbeat since it was read; forget the ones quiet for `forget_after_s`."""
        t = time.monotonic()
        for attempt_id, used in list(self._last_used.items()):
            if used < t - self.forget_after_s:
                self._last_used.pop(attempt_id, None)
                self._info.pop(attempt_id, None)
        stale = [
            a
            for a, info in list(self._info.items())
            if info.fetched_at < t - self.info_ttl_s and self._last_used.get(a, 0.0) >= info.fetched_at
        ]
        if not stale:
            return
        with self.db.session() as s:
            rows = s.execute(
                select(Attempt.id, Attempt.state, Job.tenant, Job.stop_requested, _memory_good_step().label("good"))
                .join(Job, Attempt.job_id == Job.id)
                .where(Attempt.id.in_(stale))
            ).all()
        fetched = time.monotonic()
        found = {
            r.id: AttemptInfo(r.tenant, r.state in ATTEMPT_TERMINAL or r.stop_requested, fetched, r.good) for r in rows
        }
        for attempt_id in stale:
            if attempt_id in found:
                self._info[attempt_id] = found[attempt_id]
            else:  # deleted: the next heartbeat reads again and gets a 404
                self._info.pop(attempt_id, None)

    def add(self, attempt_id: str, host: str, summary: dict[str, Any]) -> None:
        with self._lock:
            self._pending[(attempt_id, host)] = (now(), summary)

    def flush(self) -> int:
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        rows = [
            {"attempt_id": a, "host": h, "last_heartbeat_at": t, "summary": summary, "state": NodeState.RUNNING.value}
            for (a, h), (t, summary) in batch.items()
        ]
        with self.db.session() as s:
            s.execute(self._upsert(s), rows)
        return len(batch)

    def _upsert(self, s):
        """One INSERT ... ON CONFLICT DO UPDATE, run as an executemany that SQLAlchemy batches
        into multi-row VALUES: no read first, no statement per node, and the same on PostgreSQL
        and SQLite (both dialects have the construct). A node still `Starting` becomes `Running`;
        any other state (Lost, Exited) is the controller's and is kept."""
        if s.get_bind().dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        stmt = dialect_insert(Node)
        return stmt.on_conflict_do_update(
            index_elements=[Node.attempt_id, Node.host],
            set_={
                "last_heartbeat_at": stmt.excluded.last_heartbeat_at,
                "summary": stmt.excluded.summary,
                "state": case((Node.state == NodeState.STARTING.value, NodeState.RUNNING.value), else_=Node.state),
            },
        )

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception:  # the next flush carries the newer values anyway
                log.exception("heartbeat flush failed")
            try:
                self.refresh_info()
            except Exception:  # stale for one more round; the next refresh retries
                log.exception("attempt info refresh failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
