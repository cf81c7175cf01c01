"""orchestrator.heartbeats: the buffered bulk upsert, on SQLite and PostgreSQL."""

from __future__ import annotations

from orchestrator.heartbeats import HeartbeatBuffer
from orchestrator.store import Database, repo
from orchestrator.store.models import Node


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


def test_attempt_info_is_refreshed_by_the_flusher_and_forgotten_when_quiet(db):
    attempt_id = _attempt(db)
    buffer = HeartbeatBuffer(db, flush_s=3600, info_ttl_s=0.0)
    try:
        assert buffer.cached_info(attempt_id) is None
        assert buffer.attempt_info(attempt_id).stop is False
        with db.session() as s:
            repo.get_attempt(s, attempt_id).job.stop_requested = True
        assert buffer.cached_info(attempt_id).stop is False  # served from the cache: no query
        buffer.refresh_info()  # what the flusher does every round
        assert buffer.cached_info(attempt_id).stop is True
        buffer.forget_after_s = 0.0
        buffer.refresh_info()
        assert buffer.cached_info(attempt_id) is None
        assert buffer.attempt_info("no-such-attempt") is None
    finally:
        buffer.close()


def test_concurrent_misses_share_one_lookup():
    import asyncio
    import threading
    import time

    from orchestrator.api.singleflight import SingleFlight

    calls = []

    def lookup(key):
        calls.append(threading.get_ident())
        time.sleep(0.05)
        return key * 2

    async def main():
        flight = SingleFlight()
        first = await asyncio.gather(*(flight.run("k", lookup, 21) for _ in range(20)))
        second = await flight.run("k", lookup, 4)  # done lookups are not cached here
        return first, second

    first, second = asyncio.run(main())
    assert first == [42] * 20 and second == 8 and len(calls) == 2
