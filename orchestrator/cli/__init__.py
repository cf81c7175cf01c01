"""`aerie`: the command line. Talks to the API over HTTP; `aerie up` runs the control plane.

This module only assembles `app` (the console entry point, `orchestrator.cli:app`); the commands
live by what they do: `stack` (aerie up, backends), `jobs` (submit, ls, chaos, stop), `logs` (logs
and following them), `reports` (describe, goodput, events, checkpoints, ratings), `tokens`
(aerie token ...), with `api` (the client, errors as exits) and `output` (consoles, formatters)
shared by them. Each command is one short function: typer reads its signature as its --help.
"""

from __future__ import annotations

import typer

from orchestrator.cli import jobs, logs, reports, stack, tokens

app = typer.Typer(
    help="Aerie: run LLM training jobs that recover from silent failures by themselves.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Registered here, in one list, rather than by decorators in each module: `aerie --help` lists the
# commands in the order they are registered, and this is the order it has always shown them in.
app.command()(stack.up)
app.command()(jobs.submit)
app.command("ls")(jobs.list_jobs)
app.command()(reports.describe)
app.command()(reports.goodput)
app.command()(reports.events)
app.command()(logs.logs)
app.command()(jobs.chaos)
app.command()(jobs.stop)
app.command()(reports.checkpoints)
app.command()(stack.backends)
app.add_typer(tokens.token_app, name="token")
app.command()(reports.ratings)


def _mount_optional_apps() -> None:
    """Sub-commands whose code lives in the trainer (torch-free at import time)."""
    try:
        from trainer.data.cli import data_app
    except ImportError:
        return
    app.add_typer(data_app, name="data", help="Prepare training data (Megatron .bin/.idx).")
    from trainer.export_cli import export

    app.command("export")(export)


_mount_optional_apps()


def main() -> None:  # pragma: no cover
    app()
