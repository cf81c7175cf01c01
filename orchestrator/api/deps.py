"""Request dependencies: the database session and who is calling.

Auth is a dependency, not middleware, so every route states what it needs and OpenAPI shows it.
Tokens are looked up by their SHA-256 hash; agent tokens are bound to one attempt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from orchestrator.principal import WRITERS, Principal
from orchestrator.store import repo
from orchestrator.store.models import Attempt, Job

bearer = HTTPBearer(auto_error=False, description="An Aerie API token (admin, service or per-attempt agent token)")


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request. Routes use it with scope="function" so the commit happens
    before the response is sent: a client that got 200 can rely on the change being durable."""
    with request.app.state.db.session() as s:
        yield s


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
"""A route's transaction, committed before the response is sent (see `get_session`)."""


class TokenCache:
    """Valid tokens seen in the last `ttl_s` seconds, so a heartbeat costs no token query.

    Revocation through this process's API evicts at once; another process's revocation or an
    expiry takes effect within `ttl_s`."""

    def __init__(self, ttl_s: float = 10.0, max_size: int = 100_000):
        self.ttl_s = ttl_s
        self.max_size = max_size
        self._entries: dict[str, tuple[float, float | None, Principal]] = {}

    def get(self, token_hash: str) -> Principal | None:
        hit = self._entries.get(token_hash)
        if hit is None:
            return None
        fetched, expires_at, who = hit
        if time.monotonic() - fetched > self.ttl_s or (expires_at is not None and expires_at < time.time()):
            self._entries.pop(token_hash, None)
            return None
        return who

    def put(self, token_hash: str, expires_at: float | None, who: Principal) -> None:
        if len(self._entries) >= self.max_size:
            self._entries.clear()
        self._entries[token_hash] = (time.monotonic(), expires_at, who)

    def evict(self, token_id: int) -> None:
        for key, (_, _, who) in list(self._entries.items()):
            if who.token_id == token_id:
                self._entries.pop(key, None)


async def principal(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
    """Async on purpose: the cached path does no I/O, and skipping the threadpool hop is what
    lets one process answer thousands of heartbeats a second. A cache miss runs a short query."""
    if creds is None or not creds.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    cache: TokenCache = request.app.state.tokens
    key = repo.hash_token(creds.credentials)
    who = cache.get(key)
    if who is not None:
        return who
    # A miss queries the store in a worker thread, once for all the requests that missed
    # together: the event loop keeps answering heartbeats.
    who, expires_at = await request.app.state.lookups.run(
        ("token", key), _lookup_token, request.app.state.db, creds.credentials
    )
    if who is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid, expired or revoked token", headers={"WWW-Authenticate": "Bearer"}
        )
    cache.put(key, expires_at, who)
    return who


def _lookup_token(db, credentials: str) -> tuple[Principal | None, float | None]:
    with db.session() as s:
        token = repo.find_token(s, credentials)
        if token is None:
            return None, None
        return Principal(token.kind, token.tenant, token.attempt_id, token.id), token.expires_at


def user(who: Principal = Depends(principal)) -> Principal:
    """Routes for people and services; agent tokens may only report for their attempt."""
    if who.kind == "agent":
        raise HTTPException(status.HTTP_403_FORBIDDEN, "agent tokens can only report for their own attempt")
    return who


def writer(request: Request, who: Principal = Depends(user)) -> Principal:
    """Routes that change something: not for viewers, and rate-limited per token."""
    if who.kind not in WRITERS:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"a {who.kind} token is read-only")
    retry_after = request.app.state.limiter.hit(who.token_id)
    if retry_after:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "too many writes with this token; slow down",
            headers={"Retry-After": str(max(1, round(retry_after)))},
        )
    return who


def admin(who: Principal = Depends(user)) -> Principal:
    if who.kind != "admin":
        raise HTTPException(status.HTTP_403_FORBIDDEN, "only admin tokens manage tokens")
    return who


async def agent_of(attempt_id: str, who: Principal = Depends(principal)) -> Principal:
    if who.kind == "agent" and who.attempt_id != attempt_id:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this agent token belongs to another attempt")
    return who


# What a route needs of its caller, as parameter types: `who: WriterDep` reads as the rule it is.
UserDep = Annotated[Principal, Depends(user)]
WriterDep = Annotated[Principal, Depends(writer)]
AdminDep = Annotated[Principal, Depends(admin)]
AgentDep = Annotated[Principal, Depends(agent_of)]


def job_of(s: Session, who: Principal, ref: str) -> Job:
    """The caller's tenant's job by id or name; 404 for any other (another tenant's job does not exist)."""
    try:
        return repo.get_job(s, who.tenant, ref)
    except repo.NotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {ref!r}") from None


def attempt_of(s: SessionDep, attempt_id: str, who: AgentDep) -> Attempt:
    """The attempt of an attempt-scoped route's path, for its own agents (or the tenant's users);
    404 for another tenant's."""
    attempt = s.get(Attempt, attempt_id)
    if attempt is None or attempt.job.tenant != who.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt_id!r}")
    return attempt


AttemptDep = Annotated[Attempt, Depends(attempt_of)]
"""The path's attempt, checked against the caller (see `attempt_of`)."""
