"""Input hardening at the edge: a request-size cap and per-token write rate limits.

Both are in memory and per process: they protect the process that enforces them, which is the
point; a fleet behind a load balancer multiplies the budget by its size, which is acceptable.
"""

from __future__ import annotations

import threading
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class TokenBuckets:
    """`rate` writes per second per token, bursts up to `burst`."""

    def __init__(self, rate: float = 20.0, burst: float = 100.0):
        self.rate = rate
        self.burst = burst
        self._buckets: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def hit(self, key: int) -> float:
        """Take one token; 0.0 if allowed, else the seconds to wait."""
        now = time.monotonic()
        with self._lock:
            level, last = self._buckets.get(key, (self.burst, now))
            level = min(self.burst, level + (now - last) * self.rate)
            if level < 1.0:
                self._buckets[key] = (level, now)
                return (1.0 - level) / self.rate
            self._buckets[key] = (level - 1.0, now)
            return 0.0


class BodySizeLimit:
    """Refuse bodies over `max_bytes` with 413, whether or not Content-Length is declared."""

    def __init__(self, app: ASGIApp, max_bytes: int = 1 << 20):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _too_large(send, self.max_bytes)


class _TooLarge(Exception):
    pass


async def _too_large(send: Send, limit: int) -> None:
    body = f'{{"detail":"request body over {limit} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
