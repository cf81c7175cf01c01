"""What a deployment configures for its handlers: the event bus and the shared service token."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.server import build_app, build_dispatcher
from orchestrator.settings import Settings
from orchestrator.store import Database, repo

TOKEN = "aer_ser_deployed-token-from-secrets-manager"


def test_the_deployed_service_token_is_accepted_and_stays_revoked_once_revoked(aerie_home, monkeypatch):
    monkeypatch.setenv("AERIE_SERVICE_TOKEN", TOKEN)
    settings = Settings()
    assert TOKEN not in repr(settings)  # a secret: never in reprs or logs
    app = build_app(settings, with_controller=False)
    build_app(settings, with_controller=False)  # a restart (or a second replica) adopts it again: no error
    with TestClient(app) as client:
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.get("/v1/jobs", headers={"Authorization": "Bearer aer_ser_guess"}).status_code == 401
    db = Database(settings.db_url)
    with db.session() as s:
        row = repo.find_token(s, TOKEN)
        assert row.kind == "service" and row.token_hash != TOKEN
        row.revoked_at = 1.0
    build_app(settings, with_controller=False)
    with db.session() as s:
        assert repo.find_token(s, TOKEN) is None  # not brought back by a restart
    db.dispose()


@pytest.mark.parametrize("bus", ["", "aerie"])
def test_the_event_bus_setting_chooses_publication_over_in_process_handlers(aerie_home, monkeypatch, bus):
    monkeypatch.setenv("AERIE_EVENT_BUS", bus)
    settings = Settings()
    db = Database(settings.db_url)
    dispatcher = build_dispatcher(db, settings)
    if bus:
        assert dispatcher.publisher.bus == "aerie" and dispatcher.subscriptions == []
    else:
        assert dispatcher.publisher is None
        assert {s.name for s in dispatcher.subscriptions} >= {"chain_restart", "checkpoint_gc"}
        assert [s.name for s in dispatcher.subscriptions if s.slow] == ["eval_dispatch"]
    db.dispose()
