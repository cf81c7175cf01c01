"""Shared fixtures of the control-plane tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.server import build_app
from orchestrator.settings import Settings
from orchestrator.store import Database


@pytest.fixture
def api(aerie_home):
    """The app in-process on a fresh SQLite store, no controller: (client, app, admin token)."""
    settings = Settings()
    app = build_app(settings, with_controller=False)
    admin = settings.admin_token_path.read_text().strip()
    with TestClient(app) as client:
        yield client, app, admin


@pytest.fixture
def db(db_url):
    """The store on each supported database (see `db_url`)."""
    database = Database(db_url)
    yield database
    database.dispose()


@pytest.fixture
def sqlite_db(tmp_path):
    """A fresh SQLite store, for tests that set timestamps by hand and need one database only."""
    database = Database(f"sqlite:///{tmp_path / 'store.db'}")
    yield database
    database.dispose()
