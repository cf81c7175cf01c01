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

from sqlalchemy import insert, select, tuple_, update

from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Attempt, Node, now

log = logging.getLogger("aerie.heartbeats")


@dataclass(frozen=True)
class AttemptInfo:
    tenant: str
    stop: bool
    fetched_at: float


class HeartbeatBuffer:
    def __init__(self, db: Database, flush_s: float = 0.5, info_ttl_s: float = 2.0):
        self.db = db
        self.flush_s = flush_s
        self.info_ttl_s = info_ttl_s
        self._pending: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._info: dict[str, AttemptInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-flusher", daemon=True)
        self._thread.start()

    def attempt_info(self, attempt_id: str) -> AttemptInfo | None:
        """Tenant and "should stop" of an attempt, from a cache refreshed every `info_ttl_s`."""
        info = self._info.get(attempt_id)
        if info is not None and time.monotonic() - info.fetched_at < self.info_ttl_s:
            return info
        with self.db.session() as s:
            attempt = s.get(Attempt, attempt_id)
            if attempt is None:
                return None
            info = AttemptInfo(attempt.job.tenant, attempt.state in repo.ATTEMPT_TERMINAL or attempt.job.stop_requested,
                               time.monotonic())
        self._info[attempt_id] = info
        return info

    def add(self, attempt_id: str, host: str, summary: dict[str, Any]) -> None:
        with self._lock:
            self._pending[(attempt_id, host)] = (now(), summary)

    def flush(self) -> int:
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        with self.db.session() as s:
            keys = list(batch)
            existing = set(s.execute(select(Node.attempt_id, Node.host).where(
                tuple_(Node.attempt_id, Node.host).in_(keys))).tuples())
            rows = [{"attempt_id": a, "host": h, "last_heartbeat_at": t, "summary": summary}
                    for (a, h), (t, summary) in batch.items()]
            updates = [r for r in rows if (r["attempt_id"], r["host"]) in existing]
            inserts = [{**r, "state": "Running"} for r in rows if (r["attempt_id"], r["host"]) not in existing]
            if updates:  # one executemany by primary key, not one statement per node
                s.execute(update(Node), updates)
                s.execute(update(Node).where(Node.state == "Starting",
                                             tuple_(Node.attempt_id, Node.host).in_(keys)).values(state="Running"))
            if inserts:
                s.execute(insert(Node), inserts)
        return len(batch)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception:  # the next flush carries the newer values anyway
                log.exception("heartbeat flush failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
