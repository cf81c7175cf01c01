"""`GET /metrics`: the Prometheus exposition of the store (orchestrator/goodput/prometheus.py).

Auth: the scrape token (`AERIE_METRICS_TOKEN`, good for this route only) or an API token. The
scrape token and admin tokens see the whole fleet; any other person's or service's token sees its
tenant's part. Agent tokens are refused, as on every route that is not their attempt's.
"""

from __future__ import annotations

import hmac

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


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, tenant: str | None = Depends(scraper)) -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(request.app.state.db, tenant))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
