"""Shared fixtures of the control-plane tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestrator.server import build_app
from orchestrator.settings import Settings


@pytest.fixture
def api(aerie_home):
    """The app in-process on a fresh SQLite store, no controller: (client, app, admin token)."""
    settings = Settings()
    app = build_app(settings, with_controller=False)
    admin = settings.admin_token_path.read_text().strip()
    with TestClient(app) as client:
        yield client, app, admin
