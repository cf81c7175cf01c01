"""`aerie token ...`: create, list and revoke API tokens (an admin's commands)."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from orchestrator.cli.api import _call, _client
from orchestrator.cli.output import _age, console, err

token_app = typer.Typer(help="API tokens: create (shown once), list, revoke. Admin tokens only.", no_args_is_help=True)


@token_app.command("create")
def token_create(
    role: str = typer.Option("member", help="admin, member (submit/stop), viewer (read-only) or service."),
    name: str = typer.Option("", help="Who or what the token is for."),
    tenant: str | None = typer.Option(
        None, help="Tenant (default: yours; only the operator's admin may pick another)."
    ),
    expires_in: int | None = typer.Option(None, "--expires-in", help="Lifetime in seconds (default: no expiry)."),
    aws: bool = typer.Option(
        False,
        "--aws",
        help="Print AWS credential lines (access key id + secret) for the SageMaker-compatible endpoint "
        "instead: boto3 and the SageMaker SDK sign with them (SigV4) as this token's tenant and role.",
    ),
    profile: str = typer.Option("aerie", help="With --aws: the profile name of the credentials section."),
) -> None:
    """Create a token; the secret is printed once and stored only as a hash."""
    body = {"role": role, "name": name, "tenant": tenant, "expires_in_s": expires_in, "aws": aws or None}
    client = _client()
    t = _call(client.create_token, {k: v for k, v in body.items() if v is not None})
    err.print(f"token {t['id']} ({t['role']}, tenant {t['tenant']}); store it now, it is not shown again:")
    if not aws:
        print(t["token"])
        return
    err.print(
        f"AWS credentials (append to ~/.aws/credentials); point the sagemaker and logs endpoints at {client.api} "
        "(endpoint_url, or AWS_ENDPOINT_URL_SAGEMAKER / AWS_ENDPOINT_URL_CLOUDWATCH_LOGS)"
    )
    print(f"[{profile}]")
    print(f"aws_access_key_id = {t['aws_access_key_id']}")
    print(f"aws_secret_access_key = {t['aws_secret_access_key']}")
    print(f"# the same identity's Aerie API token (AERIE_TOKEN): {t['token']}")


@token_app.command("list")
def token_list() -> None:
    """List tokens (never their secrets)."""
    rows = _call(_client().tokens)
    table = Table("ID", "ROLE", "TENANT", "NAME", "AGE", "EXPIRES", "REVOKED", "AWS ACCESS KEY")
    for t in rows:
        expires = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t["expires_at"])) if t.get("expires_at") else "never"
        table.add_row(
            str(t["id"]),
            t["role"],
            t["tenant"],
            t["name"],
            _age(t["created_at"]),
            expires,
            "yes" if t["revoked"] else "",
            t.get("aws_access_key_id") or "",
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int = typer.Argument(..., help="Token id (from `aerie token list`).")) -> None:
    """Revoke a token: it stops working at once."""
    t = _call(_client().revoke_token, token_id)
    console.print(f"revoked token {t['id']} ({t['role']}, {t['name'] or 'unnamed'})")
