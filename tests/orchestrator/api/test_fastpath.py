"""orchestrator.api.fastpath: cached heartbeats answered below FastAPI, byte for byte as the route
would, and everything else left to the route (in-process app, real SQLite store)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from aerie_contracts import memckpt
from aerie_contracts.checkpoints import CheckpointTier, memory_uri
from orchestrator.server import build_app
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.models import Node


@pytest.fixture
def api(aerie_home):
    app = build_app(Settings(), with_controller=False)
    with TestClient(app) as client:
        yield client, app


def _attempt(app) -> tuple[str, str]:
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": "hb", "backend": "local", "entrypoint": ["x"]}, "default")
        attempt = repo.create_attempt(s, job, 1)
        return attempt.id, repo.mint_token(s, "agent", attempt_id=attempt.id)


def _count_route_calls(app, monkeypatch) -> list:
    """Record the requests that reach FastAPI's routing (i.e. did not take the fast path)."""
    calls = []
    router = app.router
    original = type(router).__call__

    async def counting(self, scope, receive, send):
        calls.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(type(router), "__call__", counting)
    return calls


def test_a_cached_heartbeat_takes_the_fast_path_with_the_routes_answer(api, monkeypatch):
    client, app = api
    attempt_id, token = _attempt(app)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/attempts/{attempt_id}/nodes/algo-1/heartbeat"
    calls = _count_route_calls(app, monkeypatch)

    first = client.post(url, json={"last_step": 1}, headers=auth)  # misses: the route fills the caches
    second = client.post(url, json={"last_step": 2}, headers=auth)
    assert calls == [url]
    assert first.status_code == second.status_code == 200
    assert first.content == second.content == b'{"ok":true,"stop":false,"memory_good_step":null}'
    assert first.headers["content-type"] == second.headers["content-type"] == "application/json"

    app.state.heartbeats.flush()
    with app.state.db.session() as s:
        assert s.get(Node, (attempt_id, "algo-1")).summary == {"last_step": 2}


def test_anything_unusual_goes_to_the_route(api, monkeypatch):
    client, app = api
    attempt_id, token = _attempt(app)
    other_attempt, _ = _attempt(app)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/attempts/{attempt_id}/nodes/algo-1/heartbeat"
    assert client.post(url, json={}, headers=auth).status_code == 200  # warm the caches
    calls = _count_route_calls(app, monkeypatch)

    assert client.post(url, json=[1, 2], headers=auth).status_code == 422  # not an object
    assert client.post(url, content=b"{nope", headers={**auth, "Content-Type": "application/json"}).status_code == 422
    assert client.post(url, json={}).status_code == 401  # no token
    assert client.post(url, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert (
        client.post(f"/v1/attempts/{other_attempt}/nodes/algo-1/heartbeat", json={}, headers=auth).status_code == 403
    )  # another attempt's token
    assert len(calls) == 5
    assert (
        client.post(url, content=b"x" * (2 << 20), headers={**auth, "Content-Type": "application/json"}).status_code
        == 413
    )  # the size cap wraps the fast path


def test_a_stop_reaches_the_fast_path_after_the_flushers_refresh(api):
    client, app = api
    attempt_id, token = _attempt(app)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/attempts/{attempt_id}/nodes/algo-1/heartbeat"
    assert client.post(url, json={}, headers=auth).json()["stop"] is False
    with app.state.db.session() as s:
        repo.get_attempt(s, attempt_id).job.stop_requested = True
    buffer = app.state.heartbeats
    buffer.info_ttl_s = 0.0
    buffer.refresh_info()
    assert client.post(url, json={}, headers=auth).content == b'{"ok":true,"stop":true,"memory_good_step":null}'


def _memory_checkpoint(app, attempt_id: str, step: int) -> None:
    """Both nodes' reports of a memory checkpoint: good once they cover the world (2 ranks)."""
    with app.state.db.session() as s:
        attempt = repo.get_attempt(s, attempt_id)
        uri = memory_uri(attempt.job_id, step, 1)
        for node, rank in (("algo-1", 0), ("algo-2", 1)):
            meta = {"node": node, "ranks": [rank], "world_size": 2, "replica_node": "x", "size_bytes": 1}
            repo.record_checkpoint(s, attempt, step, uri, meta, tier=CheckpointTier.MEMORY.value)


def test_the_answer_names_the_jobs_newest_good_memory_checkpoint_on_both_paths(api, monkeypatch):
    """What the nodes must never prune (agent/memckpt/store.py `retain`): read with the attempt's
    cached info, so the fast path says it too, and moved on by the flusher's refresh."""
    client, app = api
    attempt_id, token = _attempt(app)
    _memory_checkpoint(app, attempt_id, 10)
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/attempts/{attempt_id}/nodes/algo-1/heartbeat"
    calls = _count_route_calls(app, monkeypatch)
    first, second = (client.post(url, json={}, headers=auth) for _ in range(2))
    assert calls == [url]  # the second took the fast path
    assert first.content == second.content == b'{"ok":true,"stop":false,"memory_good_step":10}'

    _memory_checkpoint(app, attempt_id, 12)
    buffer = app.state.heartbeats
    buffer.info_ttl_s = 0.0
    buffer.refresh_info()
    assert client.post(url, json={}, headers=auth).json()[memckpt.HEARTBEAT_GOOD_STEP] == 12
