"""One lookup per key at a time, off the event loop.

Heartbeats arrive in bursts: when a cache entry is missing, dozens of requests for the same
attempt or token can miss together. Each would run the same query in its own worker thread;
here the first starts it and the others await its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from fastapi.concurrency import run_in_threadpool


class SingleFlight:
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future] = {}

    async def run(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> Any:
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(run_in_threadpool(fn, *args))
            self._inflight[key] = future
            future.add_done_callback(lambda _: self._inflight.pop(key, None))
        # shield: a caller that goes away must not cancel the lookup the others wait for
        return await asyncio.shield(future)
