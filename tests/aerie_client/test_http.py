"""aerie_client against the real app (in process) and a port nothing listens on: what is refused,
what is unreachable, what is retried, and the message a user reads."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from aerie_client import ApiError, Client, backoff_s, error_text
from aerie_contracts import routes
from orchestrator.server import build_app
from orchestrator.settings import Settings


@pytest.fixture
def app_client(aerie_home):
    with TestClient(build_app(Settings(), with_controller=False)) as http:
        yield http


def test_a_refusal_is_raised_at_once_with_its_status_and_detail(app_client):
    sent = []
    app_client.event_hooks["request"] = [sent.append]
    client = Client("http://testserver", "not-a-token", http=app_client)
    with pytest.raises(ApiError) as refused:
        client.request("GET", routes.jobs(), tries=3)
    assert refused.value.status == 401 and not refused.value.retryable
    assert str(refused.value).startswith("HTTP 401: ") and len(sent) == 1  # a refusal is never retried


def test_an_unreachable_api_is_status_0_and_retried(monkeypatch):
    pauses = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    client = Client("http://127.0.0.1:9", "t", timeout_s=2)
    with pytest.raises(ApiError) as gone:
        client.request("GET", routes.jobs(), tries=3)
    assert gone.value.status == 0 and gone.value.retryable
    assert "cannot reach the Aerie API at http://127.0.0.1:9" in str(gone.value)
    assert pauses == [backoff_s(0), backoff_s(1)]  # between the tries, none after the last


def test_validation_errors_read_one_line_per_field():
    body = {"detail": [{"loc": ["body", "resources", "instance_count"], "msg": "must be >= 1"}]}
    assert error_text(422, body) == "HTTP 422: invalid request\n  resources.instance_count: must be >= 1"
    assert error_text(500, "boom") == "HTTP 500: boom"
