"""A thin HTTP client for the API: what the CLI (and tests, and handlers) use.

The CLI never touches the database; it finds the API and the token the way `aerie up` left them
(`$AERIE_HOME/api.url`, `$AERIE_HOME/admin.token`) unless `AERIE_API` / `AERIE_TOKEN` say otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from aerie_contracts import env
from orchestrator.settings import Settings


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Client:
    def __init__(self, api: str | None = None, token: str | None = None, timeout_s: float = 30.0):
        settings = Settings()
        self.api = api or os.environ.get(env.API) or _read(settings.api_url_path) or settings.api_url
        self.token = token or os.environ.get(env.TOKEN) or _read(settings.admin_token_path)
        if not self.token:
            raise ApiError(
                401, f"no API token: set AERIE_TOKEN or start `aerie up` (it writes {settings.admin_token_path})"
            )
        self.http = httpx.Client(
            base_url=self.api, timeout=timeout_s, headers={"Authorization": f"Bearer {self.token}"}
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ApiError(0, f"cannot reach the Aerie API at {self.api}: is `aerie up` running?") from None
        if r.status_code >= 400:
            raise ApiError(r.status_code, _error_text(r))
        return r.json() if r.content else None

    # Jobs
    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/jobs", json=spec)

    def jobs(self, state: str | None = None) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/jobs", params={"state": state} if state else None)

    def job(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{ref}")

    def stop(self, ref: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{ref}/stop")

    def chaos(self, ref: str, node: int, rank: int | None, fault: str) -> dict[str, Any]:
        body = {"node": node, "fault": fault} | ({} if rank is None else {"rank": rank})
        return self.request("POST", f"/v1/jobs/{ref}/chaos", json=body)

    def events(self, ref: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/jobs/{ref}/events")

    def goodput(self, ref: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{ref}/goodput")

    def checkpoints(self, ref: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/jobs/{ref}/checkpoints")

    def logs(self, ref: str, attempt: int | None = None, offsets: dict[str, int] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if attempt:
            params["attempt"] = attempt
        if offsets:
            params["offsets"] = json.dumps(offsets)
        return self.request("GET", f"/v1/jobs/{ref}/logs", params=params)


def _error_text(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:500]}"
    if isinstance(detail, list):  # pydantic validation errors: one line per bad field
        lines = []
        for err in detail:
            loc = ".".join(str(p) for p in err.get("loc", []) if p != "body")
            lines.append(f"  {loc or '(body)'}: {err.get('msg')}")
        return f"HTTP {r.status_code}: invalid request\n" + "\n".join(lines)
    return f"HTTP {r.status_code}: {detail}"
