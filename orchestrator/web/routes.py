"""The dashboard's routes: login/logout, jobs list, job page, checkpoints page, curves as JSON.

Pages are server-rendered (Jinja2, autoescaped); while a job runs the page polls two URLs: the
same page with `?partial=1` (the tables, re-rendered here) and `series.json` (the curves). None of
these routes is in the OpenAPI document: they are for browsers, the API is `/v1`.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from aerie_contracts.states import JobState
from orchestrator.api.deps import Principal, SessionDep
from orchestrator.store import repo
from orchestrator.store.models import Job
from orchestrator.web import views
from orchestrator.web.auth import COOKIE, SESSION_TTL_S, is_https, safe_next, viewer

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(prefix="/ui", include_in_schema=False)
STATES = tuple(JobState)


def _ts(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "–"


def _ago(t: float | None) -> str:
    if not t:
        return "–"
    d = max(0.0, time.time() - t)
    return f"{d:.0f}s ago" if d < 120 else f"{d / 60:.0f}m ago" if d < 7200 else f"{d / 3600:.1f}h ago"


def _size(n: int | None) -> str:
    if not n:
        return "–"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _num(x: float | None, digits: int = 4) -> str:
    # Not a number: none yet, or missing (a node still in its data download or pre-flight phase).
    return f"{x:.{digits}g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


templates.env.filters.update(ts=_ts, ago=_ago, size=_size, num=_num)


def _page(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    headers = {
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
        "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    }
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=headers)


def _job(request: Request, s: Session, who: Principal, ref: str) -> Job | HTMLResponse:
    try:
        return repo.get_job(s, who.tenant, ref)
    except repo.NotFound:
        return _page(request, "notfound.html", 404, who=who, ref=ref)


# --- sign in / out ---------------------------------------------------------------------------------


@router.get("/login")
def login_form(request: Request, next: str = "/ui/jobs") -> HTMLResponse:
    return _page(request, "login.html", next=safe_next(next), error=None)


@router.post("/login")
def login(request: Request, token: str = Form(""), next: str = Form("/ui/jobs")) -> Response:
    """Check the API token, open a session; the token itself goes nowhere (not even back in the form)."""
    with request.app.state.db.session() as s:
        row = repo.find_token(s, token.strip()) if token.strip() else None
        if row is None or row.kind == "agent":
            return _page(
                request,
                "login.html",
                401,
                next=safe_next(next),
                error="That token is not valid (unknown, expired, revoked, or an agent's).",
            )
        repo.purge_web_sessions(s)
        sid = repo.open_web_session(s, row, SESSION_TTL_S)
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(
        COOKIE, sid, max_age=int(SESSION_TTL_S), httponly=True, samesite="strict", secure=is_https(request), path="/"
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    sid = request.cookies.get(COOKIE)
    if sid:
        with request.app.state.db.session() as s:
            repo.close_web_session(s, sid)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


# --- pages -----------------------------------------------------------------------------------------


@router.get("/jobs")
def jobs_page(
    s: SessionDep,
    request: Request,
    state: str = "",
    q: str = Query("", max_length=63),
    backend: str = "",
    partial: bool = False,
    who: Principal = Depends(viewer),
) -> HTMLResponse:
    return _page(
        request,
        "_job_rows.html" if partial else "jobs.html",
        who=who,
        rows=views.job_rows(s, who.tenant, state, q, backend),
        state=state,
        q=q,
        backend=backend,
        states=STATES,
        backends=sorted(request.app.state.backends),
    )


@router.get("/jobs/{job_ref}")
def job_page(
    s: SessionDep,
    request: Request,
    job_ref: str,
    partial: bool = False,
    who: Principal = Depends(viewer),
) -> HTMLResponse:
    job = _job(request, s, who, job_ref)
    if not isinstance(job, Job):
        return job
    panels = views.job_panels(
        s, job, request.app.state.backends.get(job.backend), getattr(request.app.state, "goodput_cache", None)
    )
    return _page(request, "_job_panels.html" if partial else "job.html", who=who, **panels)


@router.get("/jobs/{job_ref}/series.json")
def job_series(
    s: SessionDep,
    request: Request,
    job_ref: str,
    max_points: int = Query(views.MAX_POINTS, ge=10, le=views.MAX_POINTS),
    who: Principal = Depends(viewer),
) -> Response:
    job = _job(request, s, who, job_ref)
    if not isinstance(job, Job):
        return JSONResponse({"detail": f"no job {job_ref!r}"}, status_code=404)
    data = views.series(s, job, request.app.state.node_history, request.app.state.series_cache, max_points)
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


@router.get("/jobs/{job_ref}/checkpoints")
def checkpoints_page(
    s: SessionDep,
    request: Request,
    job_ref: str,
    who: Principal = Depends(viewer),
) -> HTMLResponse:
    job = _job(request, s, who, job_ref)
    if not isinstance(job, Job):
        return job
    return _page(request, "checkpoints.html", who=who, job=job, rows=views.checkpoint_rows(s, job))
