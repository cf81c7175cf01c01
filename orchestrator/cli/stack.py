"""`aerie up` and `aerie backends`: the control plane on this machine, and the backends it configures.

The server, its settings and the backends are imported inside the commands: every other command
only talks HTTP, and should not pay for importing uvicorn and the whole server to do so.
"""

from __future__ import annotations

import os
from typing import Any

import typer
from rich.table import Table

from aerie_contracts import env
from orchestrator.cli.api import _die
from orchestrator.cli.output import console


def _dev_stack_s3():
    """The dev stack's `ensure_s3`, imported only here: the product never needs the dev stack
    (devtools/, moto's server from the [stack] extra) unless `aerie up` starts its loopback S3."""
    try:
        from devtools.devstack import ensure_s3, missing
    except ImportError:
        absent = ["devtools"]
    else:
        absent = missing()
        if not absent:
            return ensure_s3
    from rich.markup import escape  # the message's `[stack]` is text, not a style

    _die(
        escape(
            f"with no S3 endpoint configured, `aerie up` starts the dev stack's loopback S3 server (moto), "
            f"which is not installed ({', '.join(absent)} missing).\n"
            f"  Install it:  pip install 'aerie[stack]'  (from a checkout: pip install -e '.[stack]')\n"
            f"  or point Aerie at an S3 endpoint ({env.S3_ENDPOINT} or AWS_ENDPOINT_URL), or run `aerie up --no-s3`."
        )
    )


def up(
    host: str = typer.Option(None, help="Address to listen on (default 127.0.0.1, AERIE_HOST)."),
    port: int = typer.Option(None, help="Port to listen on (default 8470, AERIE_PORT)."),
    s3: bool = typer.Option(
        True,
        "--s3/--no-s3",
        help="Start a loopback S3 server for checkpoints when no "
        "endpoint is configured (AERIE_S3_ENDPOINT / AWS_ENDPOINT_URL).",
    ),
    api_only: bool = typer.Option(
        False,
        "--api-only",
        help="Serve the API without taking part in leader election (an extra replica behind a load balancer).",
    ),
) -> None:
    """Start the control plane (API + controller) on the embedded defaults (SQLite under ~/.aerie)."""
    import uvicorn

    from orchestrator.server import build_app
    from orchestrator.settings import Settings

    overrides: dict[str, Any] = {}
    if host:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = Settings(**overrides)
    if s3 and not (os.environ.get(env.S3_ENDPOINT) or os.environ.get("AWS_ENDPOINT_URL")):
        ensure_s3 = _dev_stack_s3()
        # A separate process that outlives this one: checkpoints survive a control-plane restart.
        server = ensure_s3(log_path=settings.home_dir / "devstack" / "s3.log")
        os.environ.update(server.env())  # jobs and the in-process handlers inherit it
        console.print(
            f"  s3: {server.endpoint_url} (loopback moto server, bucket s3://{server.bucket}; "
            f"stop it with `python -m devtools.devstack down`)"
        )
    app_ = build_app(settings, with_controller=not api_only)
    settings.api_url_path.write_text(settings.api_url + "\n")
    console.print(f"Aerie control plane on [bold]{settings.api_url}[/bold]  (docs: {settings.api_url}/docs)")
    console.print(f"  store: {settings.db_url}")
    console.print(f"  admin token: {settings.admin_token_path} (mode 0600)")
    console.print(f"  jobs: {settings.jobs_dir}")
    if settings.event_bus:
        console.print(f"  events: published to EventBridge bus {settings.event_bus} (handlers run there)")
    uvicorn.run(app_, host=settings.host, port=settings.port, log_level="warning")


def backends() -> None:
    """The backends this control plane's settings configure, and whether each is reachable."""
    from orchestrator.server import build_backends
    from orchestrator.settings import Settings

    table = Table("BACKEND", "REACHABLE", "DETAIL")
    for name, backend in build_backends(Settings()).items():
        check = getattr(backend, "check", None)
        ok, detail = check() if check else (True, "runs on this machine")
        table.add_row(name, "[green]yes[/green]" if ok else "[red]no[/red]", detail)
    console.print(table)
