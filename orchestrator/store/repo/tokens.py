"""API tokens (scoped to tenant and attempt) and the dashboard's web sessions."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from orchestrator.store.models import (
    Token,
    WebSession,
    now,
)
from orchestrator.store.repo.jobs import NotFound

# --- tokens -----------------------------------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint_token(
    s: Session,
    kind: str,
    tenant: str = "default",
    attempt_id: str | None = None,
    name: str = "",
    token: str | None = None,
    expires_at: float | None = None,
    access_key_id: str | None = None,
) -> str:
    """Store a token's hash and return the token itself (shown once)."""
    token = token or f"aer_{kind[:3]}_{secrets.token_urlsafe(32)}"
    s.add(
        Token(
            token_hash=hash_token(token),
            kind=kind,
            tenant=tenant,
            attempt_id=attempt_id,
            name=name,
            expires_at=expires_at,
            access_key_id=access_key_id,
        )
    )
    return token


def list_tokens(s: Session, tenant: str | None) -> Sequence[Token]:
    """User and service tokens (agents' are per attempt and not listed); all tenants when None."""
    q = select(Token).where(Token.kind != "agent")
    if tenant is not None:
        q = q.where(Token.tenant == tenant)
    return s.scalars(q.order_by(Token.id)).all()


def revoke_token(s: Session, token_id: int, tenant: str | None) -> Token:
    row = s.get(Token, token_id)
    if row is None or (tenant is not None and row.tenant != tenant):
        raise NotFound(f"no token {token_id}")
    if row.revoked_at is None:
        row.revoked_at = now()
    return row


def find_token(s: Session, token: str) -> Token | None:
    row = s.scalars(select(Token).where(Token.token_hash == hash_token(token))).first()
    return row if _live(row) else None


def find_token_by_access_key(s: Session, access_key_id: str) -> Token | None:
    """The live token an AWS access key id belongs to (SigV4), or None."""
    row = s.scalars(select(Token).where(Token.access_key_id == access_key_id)).first()
    return row if _live(row) else None


def _live(token: Token | None) -> bool:
    """Neither revoked nor expired."""
    return token is not None and token.revoked_at is None and (token.expires_at is None or token.expires_at >= now())


# --- web sessions -----------------------------------------------------------------------------------


def open_web_session(s: Session, token: Token, ttl_s: float) -> str:
    """A new session id for a dashboard login (returned once; only its hash is stored)."""
    sid = secrets.token_urlsafe(32)
    s.add(WebSession(id_hash=hash_token(sid), token_id=token.id, expires_at=now() + ttl_s))
    return sid


def find_web_session(s: Session, sid: str) -> Token | None:
    """The live token behind a session id, or None (unknown, expired, or its token revoked/expired)."""
    row = s.get(WebSession, hash_token(sid))
    if row is None or row.expires_at < now():
        return None
    token = s.get(Token, row.token_id)
    return token if _live(token) else None


def purge_web_sessions(s: Session) -> None:
    """Forget expired sessions (called at each login, so the table stays small)."""
    s.execute(delete(WebSession).where(WebSession.expires_at < now()))


def close_web_session(s: Session, sid: str) -> None:
    row = s.get(WebSession, hash_token(sid))
    if row is not None:
        s.delete(row)
