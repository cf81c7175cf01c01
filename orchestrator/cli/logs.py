"""`aerie logs`, and the log following that `aerie logs -f` and `aerie submit --follow` share: new
output of the latest attempt, attempt after attempt, until the job ends."""

from __future__ import annotations

import sys
import time

import typer

from aerie_contracts import restarts
from aerie_contracts.states import JOB_TERMINAL
from orchestrator import follow
from orchestrator.cli.api import _call, _client
from orchestrator.cli.output import _state, console
from orchestrator.client import Client


def logs(
    job: str = typer.Argument(..., help="Job id or name."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
    attempt: int | None = typer.Option(None, help="Attempt number (default: the latest)."),
) -> None:
    """Print every node's output (ranks are prefixed with host and rank)."""
    client = _client()
    if follow:
        _follow(client, job, attempt)
        return
    offsets: dict[str, int] = {}
    while True:  # the API returns at most 1 MB per node per call
        out = _call(client.logs, job, attempt, offsets or None)
        for host, chunk in out["nodes"].items():
            sys.stdout.write(chunk["text"])
            offsets[host] = chunk["offset"]
        sys.stdout.flush()
        if not any(chunk["text"] for chunk in out["nodes"].values()):
            break


def _follow(client: Client, job: str, attempt: int | None = None, condense: bool = False) -> str:
    """Print new log output of the latest attempt until the job reaches a terminal state. With
    `condense` (`aerie submit --follow`), a failed attempt ends with its root cause, and its ranks'
    tracebacks from a broken collective are one line per node (orchestrator/follow.py)."""
    offsets: dict[str, int] = {}
    current: int | None = attempt
    condenser = follow.LogCondenser() if condense else None
    state = ""

    def read(number: int) -> bool:
        out = _call(client.logs, job, number, offsets or None)
        for host, chunk in out["nodes"].items():
            text = chunk["text"]
            if text:
                sys.stdout.write(condenser.feed(host, text) if condenser else text)
            offsets[host] = chunk["offset"]
        sys.stdout.flush()
        return any(chunk["text"] for chunk in out["nodes"].values())

    def ended(number: int) -> None:
        """What is left of attempt `number`'s logs, then (condensed) its root cause first."""
        while read(number):  # the API returns at most 1 MB per node per call
            pass
        if condenser:
            j = _call(client.job, job)  # chaining has blamed by now: the next attempt exists
            a = next((a for a in j["attempt_list"] if a["number"] == number), {})
            host, cause = follow.root_cause(j, a)
            sys.stdout.write(condenser.attempt_ended(host, cause, f"aerie logs {job} --attempt {number}"))

    while True:
        j = _call(client.job, job)
        state = j["state"]
        latest = j["attempt_list"][-1]["number"] if j["attempt_list"] else None
        if attempt is None and latest != current:
            if current is not None:
                ended(current)
                console.print(f"[yellow]--- attempt {latest} ---[/yellow]")
                # In place, the nodes that stay write on in the same logs: go on from where we are.
                mode = (j["attempt_list"][-1].get("cause") or {}).get(restarts.CAUSE_MODE)
                if mode != restarts.RestartMode.IN_PLACE:
                    offsets = {}
            current = latest
        if current is not None:
            read(current)
        if state in JOB_TERMINAL:
            if current is not None:
                ended(current)
            break
        time.sleep(1.0)
    reason = j.get("reason") or {}
    console.print(
        f"job {j['id']}: {_state(state)}" + (f" ({reason.get('kind')}: {reason.get('message', '')})" if reason else "")
    )
    return state
