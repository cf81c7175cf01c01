"""The CLI's side of the HTTP API: a client from the environment, and an API error turned into
`error: ...` on stderr and exit status 1 (or the code given) instead of a traceback.

The leading underscores mark these as private to the `orchestrator.cli` package: every command
module imports them, nothing outside the CLI should. `_client` builds `Client` from this module's
globals at each call, so a test that swaps `orchestrator.cli.api.Client` reaches every command.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from orchestrator.cli.output import err
from orchestrator.client import ApiError, Client


def _client() -> Client:
    try:
        return Client()
    except ApiError as exc:
        _die(str(exc))


def _die(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        _die(str(exc))
