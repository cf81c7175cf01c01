"""API tokens: create (shown once), list (never the secret), revoke. Admins only.

An admin manages its own tenant's tokens; the operator's bootstrap admin (tenant "default") may
create tokens for any tenant, which is how new tenants come to exist.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, Field

from orchestrator.api.deps import AdminDep, Principal, SessionDep
from orchestrator.api.schemas import AUTH_ERRORS
from orchestrator.sagemaker_api import sigv4
from orchestrator.store import repo
from orchestrator.store.models import columns, now

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=AUTH_ERRORS)
OPERATOR_TENANT = "default"


class TokenIn(BaseModel):
    role: Literal["admin", "member", "viewer", "service"] = "member"
    name: str = Field(default="", max_length=128)
    tenant: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    expires_in_s: int | None = Field(default=None, ge=60, le=10 * 365 * 86400)
    aws: bool = Field(
        default=False,
        description="Also make an AWS access key id and secret for the SageMaker-compatible endpoint (SigV4)",
    )


class TokenOut(BaseModel):
    id: int
    role: str
    tenant: str
    name: str
    created_at: float
    expires_at: float | None = None
    revoked: bool = False
    aws_access_key_id: str | None = None


class NewTokenOut(TokenOut):
    token: str
    aws_secret_access_key: str | None = Field(default=None, description="Shown once, like the token")


def _scope(who: Principal) -> str | None:
    return None if who.tenant == OPERATOR_TENANT else who.tenant


@router.post("", status_code=status.HTTP_201_CREATED, response_model=NewTokenOut)
def create(s: SessionDep, request: Request, body: TokenIn, who: AdminDep) -> NewTokenOut:
    """A token; with `aws`, also its AWS access key id and secret access key (SigV4 credentials of
    the same tenant and role for the SageMaker-compatible endpoint). Secrets are shown once."""
    tenant = body.tenant or who.tenant
    if tenant != who.tenant and who.tenant != OPERATOR_TENANT:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admins create tokens for their own tenant only")
    expires = now() + body.expires_in_s if body.expires_in_s else None
    key_id = sigv4.new_access_key_id() if body.aws else None
    token = repo.mint_token(s, body.role, tenant=tenant, name=body.name, expires_at=expires, access_key_id=key_id)
    s.flush()
    row = repo.find_token(s, token)
    assert row is not None
    secret = sigv4.derive_secret(request.app.state.sagemaker.server_key, key_id) if key_id else None
    return NewTokenOut(token=token, aws_secret_access_key=secret, **_out(row).model_dump())


@router.get("", response_model=list[TokenOut])
def list_tokens(s: SessionDep, who: AdminDep) -> list[TokenOut]:
    return [_out(t) for t in repo.list_tokens(s, _scope(who))]


@router.delete("/{token_id}", response_model=TokenOut)
def revoke(s: SessionDep, request: Request, token_id: int, who: AdminDep) -> TokenOut:
    try:
        row = repo.revoke_token(s, token_id, _scope(who))
        request.app.state.tokens.evict(token_id)
        return _out(row)
    except repo.NotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id}") from None


def _out(t) -> TokenOut:
    return TokenOut(
        **columns(t, "id", "tenant", "name", "created_at", "expires_at"),
        role=t.kind,
        revoked=t.revoked_at is not None,
        aws_access_key_id=t.access_key_id,
    )
