"""The FastAPI application: routers, the shared database and backends, the controller's lifetime."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from orchestrator import __version__
from orchestrator.api.schemas import AUTH_ERRORS
from orchestrator.api.singleflight import SingleFlight
from orchestrator.api.limits import BodySizeLimit, TokenBuckets
from orchestrator.api.routes import agents, jobs, tokens
from orchestrator.api.routes import ratings as ratings_routes
from orchestrator.api.routes import slack as slack_routes
from orchestrator.backends.base import Backend
from orchestrator.api.deps import TokenCache
from orchestrator.controller import Controller
from orchestrator.heartbeats import HeartbeatBuffer
from orchestrator.store.db import Database
from orchestrator import web


def create_app(db: Database, backends: dict[str, Backend], controller: Controller | None = None) -> FastAPI:
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
        title="Aerie", version=__version__, lifespan=lifespan,
        description="Managed training orchestrator: jobs, attempts, node health, checkpoints.",
        responses=AUTH_ERRORS,  # documented on every operation; the fuzz test holds routes to it
    )
    app.state.db = db
    app.state.backends = backends
    app.state.limiter = TokenBuckets()
    app.state.heartbeats = heartbeats
    app.state.tokens = TokenCache()
    app.state.lookups = SingleFlight()
    app.add_middleware(BodySizeLimit, max_bytes=1 << 20)
    app.include_router(jobs.router)
    app.include_router(agents.router)
    app.include_router(tokens.router)
    app.include_router(ratings_routes.router)
    app.include_router(slack_routes.router)
    web.mount(app)  # the dashboard: /ui (pages for browsers, not in the OpenAPI document)

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict:
        """Liveness probe (no token: load balancers call it)."""
        return {"ok": True}

    return app
