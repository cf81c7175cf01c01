"""JSON over HTTP to the control plane, with one error type and one retry policy.

Every caller gets the same behaviour: a bearer token on every request (per request where the
caller speaks for several attempts, as an agent does across an in-place restart), a JSON body
back (or None), `ApiError` for anything else — `status` 0 when the API could not be reached,
so callers tell "refused" from "unreachable" without knowing the transport. Retries are the
caller's choice (`tries`): only what may succeed on a second try is retried (no answer, a 5xx,
429), never a refusal, with `backoff_s` between tries. httpx, which the Lambda bundle ships too.
"""

from __future__ import annotations

import time
from typing import Any

import httpx


class ApiError(RuntimeError):
    """The API refused a request (`status` its HTTP status) or could not be reached (`status` 0)."""

    def __init__(self, status: int, message: str, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status == 429 or self.status >= 500


def backoff_s(attempt: int, cap_s: float = 5.0) -> float:
    """The pause before try `attempt + 1`: 0.3 s, doubling, at most `cap_s`."""
    return min(cap_s, 0.3 * 2.0**attempt)


class Client:
    """A small synchronous client; `call` is what the recovery package's `Transport` expects."""

    # Said after "cannot reach the Aerie API at URL" (the CLI tells its user how to start one).
    unreachable_hint = ""

    def __init__(self, base: str, token: str, *, timeout_s: float = 30.0, http: httpx.Client | None = None):
        self.base = base.rstrip("/")
        self.token = token
        # `http`: an httpx.Client of the caller's (a test's in-process app); else our own, which
        # keeps connections open between calls (an agent sends a heartbeat every few seconds).
        self.http = http or httpx.Client(base_url=self.base, timeout=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        tries: int = 1,
        token: str | None = None,
    ) -> Any:
        """The decoded JSON answer (None when empty); raises `ApiError` once `tries` are spent."""
        headers = {"Authorization": f"Bearer {token or self.token}"}
        tries = max(1, tries)
        for i in range(tries):
            try:
                return self._once(method, path, json, params, headers)
            except ApiError as exc:
                if not exc.retryable or i == tries - 1:
                    raise
            time.sleep(backoff_s(i))
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request(method, path, json=body)

    def close(self) -> None:
        self.http.close()

    def _once(self, method: str, path: str, json: Any, params: Any, headers: dict[str, str]) -> Any:
        try:
            r = self.http.request(method, path, json=json, params=params, headers=headers)
        except httpx.HTTPError as exc:
            hint = f": {self.unreachable_hint}" if self.unreachable_hint else f" ({type(exc).__name__}: {exc})"
            raise ApiError(0, f"cannot reach the Aerie API at {self.base}{hint}") from None
        body = _decoded(r)
        if r.status_code >= 400:
            raise ApiError(r.status_code, error_text(r.status_code, body), body)
        return body


def _decoded(r: httpx.Response) -> Any:
    if not r.content:
        return None
    try:
        return r.json()
    except ValueError:
        return r.text


def error_text(status: int, body: Any) -> str:
    """One readable message: FastAPI's `detail`, a pydantic error as one line per bad field."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if detail is None:
        return f"HTTP {status}: {str(body)[:500]}"
    if isinstance(detail, list):
        lines = []
        for err in detail:
            loc = ".".join(str(p) for p in err.get("loc", []) if p != "body") if isinstance(err, dict) else ""
            msg = err.get("msg") if isinstance(err, dict) else err
            lines.append(f"  {loc or '(body)'}: {msg}")
        return f"HTTP {status}: invalid request\n" + "\n".join(lines)
    return f"HTTP {status}: {detail}"
