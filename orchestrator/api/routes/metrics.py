"""`GET /metrics`: the Prometheus exposition of the store (orchestrator/goodput/prometheus.py).

Auth: the scrape token (`AERIE_METRICS_TOKEN`, good for this route only) or an API token. The
scrape token and admin tokens see the whole fleet; any other person's or service's token sees its
tenant's part. Agent tokens are refused, as on every route that is not their attempt's.

The rendered exposition is kept `SCRAPE_TTL_S` per tenant (the fleet's under None): several
Prometheus replicas, or a short scrape interval, cost one pass over the store per period, and
concurrent scrapes of the same view wait for one rendering instead of each running their own.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from orchestrator.api.deps import bearer, principal
from orchestrator.goodput.prometheus import StoreCollector

router = APIRouter()


async def scraper(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str | None:
    """The tenant the scrape may see (None: all of them)."""
    scrape: str | None = getattr(request.app.state, "metrics_token", None)
    if scrape and creds is not None and hmac.compare_digest(creds.credentials.encode(), scrape.encode()):
        return None
    who = await principal(request, creds)
    if who.kind == "agent":
        raise HTTPException(status.HTTP_403_FORBIDDEN, "agent tokens can only report for their own attempt")
    return None if who.kind == "admin" else who.tenant


SCRAPE_TTL_S = 5.0


class ExpositionCache:
    """The rendered exposition per tenant, for `ttl_s` seconds."""

    def __init__(self, ttl_s: float = SCRAPE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._entries: dict[str | None, tuple[float, bytes]] = {}
        self._locks: dict[str | None, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, tenant: str | None, render: Callable[[], bytes]) -> bytes:
        with self._guard:
            lock = self._locks.setdefault(tenant, threading.Lock())
        with lock:  # one rendering per tenant at a time: the others wait and take its result
            entry = self._entries.get(tenant)
            if entry is not None and self.clock() - entry[0] < self.ttl_s:
                return entry[1]
            body = render()
            self._entries[tenant] = (self.clock(), body)
            return body


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, tenant: str | None = Depends(scraper)) -> Response:
    def render() -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(request.app.state.db, tenant))
        return generate_latest(registry)

    cache: ExpositionCache = request.app.state.metrics_cache
    return Response(cache.get(tenant, render), media_type=CONTENT_TYPE_LATEST)
