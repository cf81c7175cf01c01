"""The CLI's client of the API (and the tests' and the demo's): `aerie_client.Client` found the
way `aerie up` left the API, with a method per command.

The CLI never touches the database; it finds the API and the token the way `aerie up` left them
(`$AERIE_HOME/api.url`, `$AERIE_HOME/admin.token`) unless `AERIE_API` / `AERIE_TOKEN` say otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aerie_client
from aerie_client import ApiError
from aerie_contracts import env, routes
from orchestrator.settings import Settings

__all__ = ["ApiError", "Client"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Client(aerie_client.Client):
    unreachable_hint = "is `aerie up` running?"

    def __init__(self, api: str | None = None, token: str | None = None, timeout_s: float = 30.0):
        settings = Settings()
        self.api = api or os.environ.get(env.API) or _read(settings.api_url_path) or settings.api_url
        token = token or os.environ.get(env.TOKEN) or _read(settings.admin_token_path)
        if not token:
            raise ApiError(
                401, f"no API token: set AERIE_TOKEN or start `aerie up` (it writes {settings.admin_token_path})"
            )
        super().__init__(self.api, token, timeout_s=timeout_s)

    # Jobs
    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", routes.jobs(), json=spec)

    def jobs(self, state: str | None = None) -> list[dict[str, Any]]:
        return self.request("GET", routes.jobs(), params={"state": state} if state else None)

    def job(self, ref: str) -> dict[str, Any]:
        return self.request("GET", routes.job(ref))

    def stop(self, ref: str) -> dict[str, Any]:
        return self.request("POST", routes.job_stop(ref))

    def chaos(self, ref: str, node: int, rank: int | None, fault: str) -> dict[str, Any]:
        body = {"node": node, "fault": fault} | ({} if rank is None else {"rank": rank})
        return self.request("POST", routes.job_chaos(ref), json=body)

    def events(self, ref: str) -> list[dict[str, Any]]:
        return self.request("GET", routes.job_events(ref))

    def goodput(self, ref: str) -> dict[str, Any]:
        return self.request("GET", routes.job_goodput(ref))

    def checkpoints(self, ref: str) -> list[dict[str, Any]]:
        return self.request("GET", routes.job_checkpoints(ref))

    def ratings(self, ref: str) -> list[dict[str, Any]]:
        return self.request("GET", routes.job_ratings(ref))

    def logs(self, ref: str, attempt: int | None = None, offsets: dict[str, int] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if attempt:
            params["attempt"] = attempt
        if offsets:
            params["offsets"] = json.dumps(offsets)
        return self.request("GET", routes.job_logs(ref), params=params)

    # Tokens
    def create_token(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", routes.tokens(), json=body)

    def tokens(self) -> list[dict[str, Any]]:
        return self.request("GET", routes.tokens())

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return self.request("DELETE", routes.token(token_id))
