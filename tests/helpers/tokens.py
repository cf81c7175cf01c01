"""Bearer headers and tokens minted through the API, and a running attempt with its agent's token,
for in-process API tests."""

from __future__ import annotations


def auth_header(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def make_token(client, admin: str, **body) -> str:
    """A new token made by `admin` through POST /v1/tokens (body: role, name, tenant, ...)."""
    r = client.post("/v1/tokens", json=body, headers=auth_header(admin))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def agent_attempt(app, name: str, reason: dict | None = None) -> tuple[str, str, str]:
    """A local job's attempt 1 on algo-1 and algo-2, Running (Failed with `reason` when given),
    and its agent's token, in the in-process app's store: (job id, attempt id, token)."""
    from orchestrator.store import repo

    with app.state.db.session() as s:
        job = repo.create_job(s, {"name": name, "backend": "local", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1", "algo-2"]}
        repo.set_attempt_state(s, attempt, "Running")
        if reason is not None:
            repo.set_attempt_state(s, attempt, "Failed", reason)
        return job.id, attempt.id, repo.mint_token(s, "agent", attempt_id=attempt.id)
