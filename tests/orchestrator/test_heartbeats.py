"""orchestrator.heartbeats: the buffered bulk upsert, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from orchestrator.heartbeats import HeartbeatBuffer
from orchestrator.store import Database, repo
from orchestrator.store.models import Node


@pytest.fixture
def db(db_url):
    database = Database(db_url)
    yield database
    database.dispose()


def _attempt(db: Database) -> str:
    with db.session() as s:
        job = repo.create_job(s, {"name": "hb", "backend": "local", "entrypoint": ["x"]}, "default")
        attempt = repo.create_attempt(s, job, 1)
        repo.node(s, attempt, "algo-1")  # registered by the backend: Starting
        lost = repo.node(s, attempt, "algo-3")
        lost.state = "Lost"
        return attempt.id


def test_a_flush_inserts_updates_and_keeps_the_controllers_states(db):
    attempt_id = _attempt(db)
    buffer = HeartbeatBuffer(db, flush_s=3600)
    try:
        for step in (1, 2):  # only the newest summary per node is written
            for host in ("algo-1", "algo-2", "algo-3"):
                buffer.add(attempt_id, host, {"last_step": step, "host": host})
        assert buffer.flush() == 3
        assert buffer.flush() == 0
        buffer.add(attempt_id, "algo-2", {"last_step": 3})
        assert buffer.flush() == 1
    finally:
        buffer.close()
    with db.session() as s:
        nodes = {n.host: n for n in s.query(Node).filter_by(attempt_id=attempt_id)}
        assert {h: n.state for h, n in nodes.items()} == {"algo-1": "Running", "algo-2": "Running", "algo-3": "Lost"}
        assert nodes["algo-1"].summary == {"last_step": 2, "host": "algo-1"}
        assert nodes["algo-2"].summary == {"last_step": 3}
        assert all(n.last_heartbeat_at for n in nodes.values())
