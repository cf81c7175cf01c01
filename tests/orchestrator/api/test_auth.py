"""Auth and validation at the API's edge (in-process app, real SQLite store, no controller)."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator.server import build_app
from orchestrator.settings import Settings
from orchestrator.store import repo

# Authenticated by Slack's request signature instead of a bearer token (tested in test_slack.py).
SIGNED_BY_SLACK = {"/v1/slack/interactions"}


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _job_with_attempt(app, name: str) -> tuple[str, str, str]:
    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": name, "backend": "local", "entrypoint": ["x"]}, "default")
        attempt = repo.create_attempt(s, job, 1)
        token = repo.mint_token(s, "agent", attempt_id=attempt.id)
        return job.id, attempt.id, token


def test_admin_token_file_is_private_and_stable(api, aerie_home):
    _client, _app, admin = api
    settings = Settings()  # what the app was built from: the same environment
    mode = stat.S_IMODE(os.stat(settings.admin_token_path).st_mode)
    assert mode == 0o600
    build_app(settings, with_controller=False)  # a restart keeps the same token
    assert settings.admin_token_path.read_text().strip() == admin


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
        ("POST", "/v1/jobs/x/stop"),
        ("GET", "/v1/jobs/x/events"),
        ("GET", "/v1/jobs/x/logs"),
        ("GET", "/v1/jobs/x/attempts"),
        ("POST", "/v1/attempts/a/nodes/h/heartbeat"),
        ("POST", "/v1/attempts/a/nodes/h/verdicts"),
    ],
)
def test_every_route_needs_a_token(api, method, path):
    client, *_ = api
    assert client.request(method, path).status_code == 401
    assert client.request(method, path, headers=_auth("aer_adm_wrong")).status_code == 401


def test_every_v1_route_is_covered_by_the_401_test(api):
    """A new route must not slip in without auth: all /v1 operations refuse anonymous calls."""
    client, app, *_ = api
    for path, ops in app.openapi()["paths"].items():
        if not path.startswith("/v1/") or path in SIGNED_BY_SLACK:
            continue
        for method in ops:
            url = (
                path.replace("{token_id}", "1")
                .replace("{job_ref}", "x")
                .replace("{attempt_id}", "a")
                .replace("{host}", "h")
            )
            assert client.request(method.upper(), url).status_code == 401, (method, path)


def test_agent_token_works_only_for_its_own_attempt(api):
    client, app, *_ = api
    _, attempt_a, token_a = _job_with_attempt(app, "job-a")
    _, attempt_b, _ = _job_with_attempt(app, "job-b")
    ok = client.post(f"/v1/attempts/{attempt_a}/nodes/algo-1/heartbeat", json={"t": 1.0}, headers=_auth(token_a))
    assert ok.status_code == 200
    for route in ("heartbeat", "verdicts", "exit", "checkpoints"):
        r = client.post(f"/v1/attempts/{attempt_b}/nodes/algo-1/{route}", json={}, headers=_auth(token_a))
        assert r.status_code == 403, route
    # ... and agent tokens can't use the user routes at all.
    assert client.get("/v1/jobs", headers=_auth(token_a)).status_code == 403


def test_spec_with_three_bad_fields_is_refused_naming_all_three(api):
    client, _app, admin = api
    bad = {"name": "not a valid name!", "entrypoint": [], "resources": {"instance_count": -1}}
    r = client.post("/v1/jobs", json=bad, headers=_auth(admin))
    assert r.status_code == 422
    locs = {tuple(e["loc"][1:]) for e in r.json()["detail"]}
    assert locs == {("name",), ("entrypoint",), ("resources", "instance_count")}


def test_submit_list_describe_stop(api):
    client, _app, admin = api
    r = client.post("/v1/jobs", json={"name": "ok", "entrypoint": ["python", "x.py"]}, headers=_auth(admin))
    assert r.status_code == 201
    job_id = r.json()["id"]
    assert [j["id"] for j in client.get("/v1/jobs", headers=_auth(admin)).json()] == [job_id]
    assert client.get("/v1/jobs/ok", headers=_auth(admin)).json()["id"] == job_id
    assert client.get("/v1/jobs/nope", headers=_auth(admin)).status_code == 404
    assert client.post(f"/v1/jobs/{job_id}/stop", headers=_auth(admin)).status_code == 200
    assert client.get("/openapi.json").status_code == 200


def test_numbers_beyond_64_bits_are_refused_not_crashed_on(api):
    """Found by the fuzz test: an offset of 2**63 overflowed in the SQLite driver (a 500)."""
    client, _app, admin = api
    huge = 2**63
    assert client.get(f"/v1/jobs?offset={huge}", headers=_auth(admin)).status_code == 422
    assert client.delete(f"/v1/tokens/{huge}", headers=_auth(admin)).status_code == 422
    assert client.get("/v1/jobs?offset=9223372036854775807", headers=_auth(admin)).status_code == 200
