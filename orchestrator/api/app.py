"""The FastAPI application: routers, the shared database and backends, the controller's lifetime."""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from orchestrator import __version__
from orchestrator.api.deps import TokenCache
from orchestrator.api.fastpath import HeartbeatFastPath
from orchestrator.api.limits import BodySizeLimit, TokenBuckets
from orchestrator.api.routes import agents, jobs, tokens
from orchestrator.api.routes import chaos as chaos_routes
from orchestrator.api.routes import checkpoints as checkpoint_routes
from orchestrator.api.routes import goodput as goodput_routes
from orchestrator.api.routes import metrics as metrics_routes
from orchestrator.api.routes import ratings as ratings_routes
from orchestrator.api.routes import slack as slack_routes
from orchestrator.api.schemas import AUTH_ERRORS, MAX_DB_INT
from orchestrator.api.singleflight import SingleFlight
from orchestrator.backends.base import Backend
from orchestrator.controller import Controller
from orchestrator.heartbeats import HeartbeatBuffer

if TYPE_CHECKING:
    from orchestrator.sagemaker_api.call import EndpointSettings
from orchestrator.store.db import Database


def create_app(
    db: Database,
    backends: dict[str, Backend],
    controller: Controller | None = None,
    sagemaker: EndpointSettings | None = None,
) -> FastAPI:
    # Imported here: the endpoint's modules use this package's auth dependencies.
    from orchestrator.sagemaker_api.call import EndpointSettings
    from orchestrator.sagemaker_api.gateway import SageMakerGateway

    heartbeats = HeartbeatBuffer(db)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if controller is not None:
            controller.start()
        try:
            yield
        finally:
            if controller is not None:
                controller.stop()
            heartbeats.close()

    app = FastAPI(
        title="Aerie",
        version=__version__,
        lifespan=lifespan,
        description="Managed training orchestrator: jobs, attempts, node health, checkpoints.",
        responses=AUTH_ERRORS,  # documented on every operation; the fuzz test holds routes to it
    )
    app.state.db = db
    app.state.backends = backends
    app.state.limiter = TokenBuckets()
    app.state.heartbeats = heartbeats
    app.state.tokens = TokenCache()
    app.state.lookups = SingleFlight()
    app.state.metrics_cache = metrics_routes.ExpositionCache()  # GET /metrics: the exposition per tenant, a few seconds
    # The SageMaker-compatible endpoint (POST / with X-Amz-Target); without settings, an
    # ephemeral SigV4 key (AWS keys made by such an app work only while it lives).
    app.state.sagemaker = sagemaker or EndpointSettings(server_key=secrets.token_bytes(32))
    # Starlette runs the middleware added last first: the size cap wraps the heartbeat fast path,
    # which wraps the SageMaker endpoint (so heartbeats never pay for its check).
    app.add_middleware(SageMakerGateway, api=app)
    app.add_middleware(HeartbeatFastPath, api=app)
    app.add_middleware(BodySizeLimit, max_bytes=1 << 20)
    app.include_router(jobs.router)
    app.include_router(chaos_routes.router)
    app.include_router(goodput_routes.router)
    app.include_router(metrics_routes.router)
    app.include_router(agents.router)
    app.include_router(checkpoint_routes.attempts)
    app.include_router(checkpoint_routes.jobs)
    app.include_router(tokens.router)
    app.include_router(ratings_routes.router)
    app.include_router(slack_routes.router)

    @app.exception_handler(OverflowError)
    @app.exception_handler(DataError)
    async def out_of_range(_request: Request, exc: Exception) -> JSONResponse:
        """A number the store cannot hold (beyond 64 bits) is the caller's mistake: 422 in
        FastAPI's validation-error shape, not a 500 from deep in the driver."""
        return JSONResponse(
            status_code=422,
            content={
                "detail": [
                    {
                        "loc": ["request"],
                        "type": "value_error",
                        "msg": f"a number is out of range (the largest accepted is {MAX_DB_INT})",
                    }
                ]
            },
        )

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict:
        """Liveness probe (no token: load balancers call it)."""
        return {"ok": True}

    return app
