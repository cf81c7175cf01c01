"""The heartbeat fast path: the common case answered below FastAPI's routing.

With thousands of nodes, heartbeats are most of the API's traffic, and most of their cost is the
framework (routing, dependency injection, validation, response models), not the work, which is two
dictionary lookups and one store into the buffer. A heartbeat whose agent token and attempt are
both already cached and whose body is a JSON object is answered here, with the bytes the route
would send. Anything else (a cache miss, another kind of token, another content type, a body that
is not a JSON object) goes on unchanged to the FastAPI route, which stays the documented and
validated definition of the endpoint. The body-size cap (BodySizeLimit) wraps this middleware.
"""

from __future__ import annotations

import functools
import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.api.routes.agents import store_heartbeat
from orchestrator.api.schemas import HeartbeatOut
from orchestrator.store import repo

PATH = re.compile(r"^/v1/attempts/([^/]+)/nodes/([^/]+)/heartbeat$")


@functools.lru_cache(maxsize=4096)
def answer(stop: bool, memory_good_step: int | None) -> bytes:
    """The route's answer bytes (HeartbeatOut, as FastAPI serialises it)."""
    out = HeartbeatOut(stop=stop, memory_good_step=memory_good_step)
    return json.dumps(out.model_dump(mode="json"), separators=(",", ":")).encode()


class HeartbeatFastPath:
    def __init__(self, app: ASGIApp, api) -> None:
        self.app = app
        self.api = api  # the FastAPI application whose state holds the caches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        info = self._cached(scope, match) if match else None
        if info is None:
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        try:
            summary = json.loads(body)
        except ValueError:
            summary = None
        if not isinstance(summary, dict):  # let the route answer it (422) exactly as documented
            return await self.app(scope, _replay(body, receive), send)
        attempt_id, host = match.groups()
        store_heartbeat(self.api.state, attempt_id, host, summary)
        body_out = answer(info.stop, info.memory_good_step)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body_out)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body_out})

    def _cached(self, scope: Scope, match: re.Match):
        """The attempt's cached info when this request may take the fast path, else None."""
        headers = dict(scope["headers"])
        if not headers.get(b"content-type", b"").startswith(b"application/json"):
            return None
        scheme, _, credentials = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not credentials:
            return None
        state = self.api.state
        who = state.tokens.get(repo.hash_token(credentials))
        attempt_id = match.group(1)
        if who is None or who.kind != "agent" or who.attempt_id != attempt_id:
            return None
        info = state.heartbeats.cached_info(attempt_id)
        return info if info is not None and info.tenant == who.tenant else None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
