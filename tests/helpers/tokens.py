"""Bearer headers and tokens minted through the API, for in-process API tests."""

from __future__ import annotations


def auth_header(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def make_token(client, admin: str, **body) -> str:
    """A new token made by `admin` through POST /v1/tokens (body: role, name, tenant, ...)."""
    r = client.post("/v1/tokens", json=body, headers=auth_header(admin))
    assert r.status_code == 201, r.text
    return r.json()["token"]
