"""The web dashboard, served by the API process (see orchestrator/web/routes.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from orchestrator.web.auth import LoginRequired, login_redirect_url
from orchestrator.web.health import NodeHistory

STATIC = Path(__file__).parent / "static"


def mount(app: FastAPI) -> None:
    """Add the dashboard to the API app: its routes, static files, and the node health history
    the heartbeat route feeds (`app.state.node_history`)."""
    from orchestrator.web.routes import router

    app.state.node_history = NodeHistory()
    app.state.series_cache = {}
    app.state.goodput_cache = {}  # views.goodput_panel: a running job's ledger for GOODPUT_TTL_S
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse(login_redirect_url(exc.next_url), status_code=303)

    @app.get("/", include_in_schema=False)
    def _root() -> RedirectResponse:
        return RedirectResponse("/ui/jobs", status_code=303)
