"""Tenants, roles and token lifecycle (issue: reliability and security of the control plane)."""

from __future__ import annotations

import re

from orchestrator.store import repo
from tests.helpers.tokens import auth_header as _h
from tests.helpers.tokens import make_token as _token

# Routes authenticated by something other than a bearer token (tested elsewhere).
NOT_BEARER = {"/v1/slack/interactions"}
# A valid body per POST route (by last path segment), so the answer is about the object, not the body.
VALID_BODIES = {
    "attempts": {"number": 2},
    "verdicts": {"kind": "silent.hang"},
    "exit": {"exit_code": 0},
    "checkpoints": {"step": 1, "uri": "s3://b/k"},
    "heartbeat": {},
    "fail": {"reason": {}},
    "stop": {},
}


def test_token_lifecycle_create_list_revoke(api):
    client, _app, admin = api
    r = client.post("/v1/tokens", json={"role": "member", "name": "alice", "tenant": "team-a"}, headers=_h(admin))
    assert r.status_code == 201
    created = r.json()
    assert created["token"].startswith("aer_mem_") and created["tenant"] == "team-a"
    listed = client.get("/v1/tokens", headers=_h(admin)).json()
    assert any(t["id"] == created["id"] for t in listed)
    assert all("token" not in t for t in listed)  # the secret is shown once, at creation
    assert client.get("/v1/jobs", headers=_h(created["token"])).status_code == 200
    assert client.delete(f"/v1/tokens/{created['id']}", headers=_h(admin)).status_code == 200
    assert client.get("/v1/jobs", headers=_h(created["token"])).status_code == 401


def test_expired_tokens_are_refused(api):
    client, app, _admin = api
    with app.state.db.session() as s:
        token = repo.mint_token(s, "member", expires_at=1.0)
    assert client.get("/v1/jobs", headers=_h(token)).status_code == 401


def test_viewer_reads_but_cannot_submit_or_stop(api):
    client, _app, admin = api
    member = _token(client, admin, role="member")
    viewer = _token(client, admin, role="viewer")
    job = client.post("/v1/jobs", json={"name": "j", "entrypoint": ["x"]}, headers=_h(member)).json()
    assert client.get(f"/v1/jobs/{job['id']}", headers=_h(viewer)).status_code == 200
    assert client.post("/v1/jobs", json={"name": "j2", "entrypoint": ["x"]}, headers=_h(viewer)).status_code == 403
    assert client.post(f"/v1/jobs/{job['id']}/stop", headers=_h(viewer)).status_code == 403
    assert client.get("/v1/tokens", headers=_h(member)).status_code == 403  # members don't manage tokens


def test_tenant_admins_manage_only_their_tenant(api):
    client, _app, admin = api
    a_admin = _token(client, admin, role="admin", tenant="team-a")
    assert client.post("/v1/tokens", json={"tenant": "team-b"}, headers=_h(a_admin)).status_code == 403
    b_member = _token(client, admin, role="member", tenant="team-b")
    b_id = next(t["id"] for t in client.get("/v1/tokens", headers=_h(admin)).json() if t["tenant"] == "team-b")
    assert client.delete(f"/v1/tokens/{b_id}", headers=_h(a_admin)).status_code == 404
    assert client.get("/v1/jobs", headers=_h(b_member)).status_code == 200


def test_tenant_b_gets_404_for_every_route_on_tenant_a_objects(api):
    """Enumerates the app's routes, so a new route can't be forgotten."""
    client, app, admin = api
    a = _token(client, admin, role="admin", tenant="team-a")
    b = _token(client, admin, role="admin", tenant="team-b")
    job = client.post("/v1/jobs", json={"name": "secret-job", "entrypoint": ["x"]}, headers=_h(a)).json()
    with app.state.db.session() as s:
        attempt = repo.create_attempt(s, repo.get_job(s, "team-a", job["id"]), 1)
        attempt_id = attempt.id
    a_token_id = next(t["id"] for t in client.get("/v1/tokens", headers=_h(a)).json())
    values = {
        "job_ref": job["id"],
        "attempt_id": attempt_id,
        "host": "algo-1",
        "token_id": str(a_token_id),
        "sample_id": "1",
        "number": "1",
    }
    checked = 0
    for path, ops in app.openapi()["paths"].items():
        if not path.startswith("/v1/") or path in NOT_BEARER:
            continue
        params = re.findall(r"{(\w+)}", path)
        if not params:
            continue
        url = path
        for p in params:
            url = url.replace("{" + p + "}", values[p])
        for method in ops:
            body = VALID_BODIES.get(path.rsplit("/", 1)[-1], {}) if method == "post" else None
            r = client.request(method.upper(), url, headers=_h(b), json=body)
            if r.status_code == 422:  # the body was judged before the object: same answer for the owner
                assert client.request(method.upper(), url, headers=_h(a), json=body).status_code == 422, path
                continue
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            checked += 1
    assert checked >= 10
    # The list routes simply don't show them.
    assert client.get("/v1/jobs", headers=_h(b)).json() == []
    assert [j["id"] for j in client.get("/v1/jobs", headers=_h(a)).json()] == [job["id"]]
