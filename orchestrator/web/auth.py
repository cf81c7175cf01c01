"""Dashboard sign-in: the API token, typed once into a form, opens a server-side session.

The browser keeps only a random session id in an HttpOnly, SameSite=Strict cookie; the store keeps
its hash and the token's id, never the token. A session answers for exactly the token's tenant and
role, so the pages see what the API would; revoking the token ends its sessions. Agent tokens
can't sign in.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request

from orchestrator.api.deps import Principal
from orchestrator.store import repo

COOKIE = "aerie_session"
SESSION_TTL_S = 12 * 3600.0


class LoginRequired(Exception):
    """Raised by `viewer`; the app answers it with a redirect to the login form."""

    def __init__(self, next_url: str = "/ui/jobs"):
        self.next_url = next_url


def viewer(request: Request) -> Principal:
    """Who the session belongs to, or LoginRequired (no cookie, unknown/expired session, dead token)."""
    sid = request.cookies.get(COOKIE)
    if sid:
        with request.app.state.db.session() as s:
            token = repo.find_web_session(s, sid)
            if token is not None and token.kind != "agent":
                return Principal(token.kind, token.tenant, None, token.id)
    raise LoginRequired(request.url.path)


def login_redirect_url(next_url: str) -> str:
    return "/ui/login?next=" + quote(safe_next(next_url), safe="/")


def safe_next(next_url: str | None) -> str:
    """Only our own pages: never an open redirect to another site."""
    if next_url and next_url.startswith("/ui/") and not next_url.startswith("/ui//") and "\\" not in next_url:
        return next_url
    return "/ui/jobs"


def is_https(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"
