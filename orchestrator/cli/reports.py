"""The read-only views of one job: describe, its events, its goodput ledger, its checkpoints and
the human eval ratings of them. Each prints what the API already computed; none changes a job."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from aerie_contracts import preflight, restarts
from orchestrator import goodput_view
from orchestrator.cli.api import _call, _client
from orchestrator.cli.output import _age, _bytes, _state, console
from orchestrator.client import ApiError
from orchestrator.stacks_view import stop_time_lines


def describe(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """Show a job: its state, every attempt with its reason, nodes and verdicts."""
    d = _call(_client().job, job)
    console.print(
        f"[bold]{d['id']}[/bold]  {_state(d['state'])}  backend={d['backend']}  created {_age(d['created_at'])} ago"
    )
    if d.get("reason"):
        console.print(f"  reason: {d['reason'].get('kind')}: {d['reason'].get('message', '')}")
    table = Table(
        "ATTEMPT", "STATE", "REASON", "EXIT", "RESTART", "RESUMED FROM", "NODES", "SPARES", "EXCLUDED", "DURATION"
    )
    for a in d["attempt_list"]:
        reason = a.get("reason") or {}
        dur = (a["ended_at"] or time.time()) - a["started_at"] if a.get("started_at") else None
        # A node that took a failed one's slot as a hot spare says so ("algo-3:Running (spare for algo-2)").
        was_spare = {v: k for k, v in ((a.get("cause") or {}).get(restarts.CAUSE_REPLACED_NODES) or {}).items()}
        nodes = ", ".join(
            f"{n['host']}:{n['state']}" + (f" (spare for {was_spare[n['host']]})" if n["host"] in was_spare else "")
            for n in a["nodes"]
        )
        table.add_row(
            str(a["number"]),
            _state(a["state"]),
            reason.get("kind", ""),
            "" if a["exit_code"] is None else str(a["exit_code"]),
            (a.get("cause") or {}).get(restarts.CAUSE_MODE, ""),
            a.get("resume_from") or "",
            nodes,
            ", ".join(a.get("spares") or []),
            ", ".join(a.get("exclude_nodes") or []),
            f"{dur:.0f}s" if dur is not None else "",
        )
    console.print(table)
    for a in d["attempt_list"]:
        why = (a.get("cause") or {}).get(restarts.CAUSE_MODE_REASON)
        if why:
            console.print(f"  attempt {a['number']} {a['cause'][restarts.CAUSE_MODE]}: {why}")
    _preflight_table(d["attempt_list"])
    if d["verdicts"]:
        vt = Table("VERDICT", "ATTEMPT", "HOST", "MESSAGE")
        for v in d["verdicts"]:
            vt.add_row(v["kind"], v["attempt_id"], v["host"], v["message"])
        console.print(vt)
    if d.get("blames"):
        bt = Table("BLAMED NODE", "ATTEMPT", "FOR", "WHY", "STATUS")
        for b in d["blames"]:
            status = f"cleared ({b['cleared_by']})" if b.get("cleared_at") else "counts"
            bt.add_row(b["host"], b["attempt_id"], b["kind"], f"{b['rule']}: {b['why']}", status)
        console.print(bt)
    for line in stop_time_lines(d["verdicts"]):
        console.print(line, markup=False, highlight=False)
    led = _goodput_or_none(d["id"])
    if led is not None:
        console.print(goodput_view.summary(led))
        for line in goodput_view.advice_lines(led):
            console.print(line)


def _preflight_table(attempts: list[dict]) -> None:
    """One row per node that ran the pre-flight checks: each check's measured value against its
    threshold, and, for a node that failed, why (the evidence to send bad hardware back)."""
    rows = [(a, n["host"], n["preflight"]) for a in attempts for n in a["nodes"] if n.get("preflight")]
    # Hot spares check themselves alone while they wait (no attempt node yet).
    rows += [(a, f"{h} (spare)", r) for a in attempts for h, r in (a.get("spare_preflight") or {}).items()]
    if not rows:
        return
    table = Table("PRE-FLIGHT", "ATTEMPT", "HOST", "TOOK", "CHECKS", "WHY")
    for a, host, res in rows:
        checks = []
        for c in res.get("checks") or []:
            value = c.get("value")
            shown = "skipped" if c.get("skipped") else "" if value is None else f"{value:.3g}"
            if c.get("threshold") and not c.get("skipped"):
                shown += f"/{c['threshold']:g}"
            checks.append(f"{c.get('check')}={shown}{'' if c.get('passed') else ' FAIL'}".rstrip("="))
        took = res.get("elapsed_s")
        table.add_row(
            "passed" if res.get("passed") else "[red]FAILED[/red]",
            str(a["number"]),
            host,
            f"{took:.1f}s" if isinstance(took, (int, float)) else "",
            " ".join(checks),
            "" if res.get("passed") else preflight.summary_line(res).split(": ", 1)[-1],
        )
    console.print(table)


def _goodput_or_none(job: str) -> dict | None:
    try:
        return _client().goodput(job)
    except ApiError:
        return None  # an older control plane without the ledger: describe still works


def goodput(
    job: str = typer.Argument(..., help="Job id or name."),
    as_json: bool = typer.Option(False, "--json", help="Print the ledger as JSON."),
) -> None:
    """Where the job's paid time went: productive steps and badput by cause, with interval advice."""
    led = _call(_client().goodput, job)
    if as_json:
        print(json.dumps(led, indent=2))
        return
    console.print(goodput_view.table(led))
    if led["faults"]:
        console.print(goodput_view.faults_table(led["faults"]))
    console.print(goodput_view.summary(led))
    for line in goodput_view.advice_lines(led):
        console.print(line)


def events(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """The job's event history (the outbox), oldest first."""
    rows = _call(_client().events, job)
    table = Table("SEQ", "TIME", "TYPE", "DETAIL", "DELIVERY")
    for row in rows:
        e = row["event"]
        d = e["detail"]
        parts = [f"attempt {d['attempt']}" if "attempt" in d else "", d.get("state", ""), d.get("kind", "")]
        if d.get("reason"):
            parts.append(f"reason={d['reason'].get('kind')}")
        if d.get("exit_code") is not None:
            parts.append(f"exit_code={d['exit_code']}")
        if d.get("step") is not None:
            parts.append(f"step={d['step']}")
        if d.get("summary"):  # a node's pre-flight result
            parts.append(f"{d.get('host')}: pre-flight {d['summary']}")
        table.add_row(
            str(row["seq"]),
            e["time"][11:19],
            e["detail-type"].removeprefix("Aerie "),
            " ".join(p for p in parts if p),
            row["status"],
        )
    console.print(table)


def checkpoints(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """The job's committed checkpoints: step, state (good, bad, deleted) and why, size, age."""
    rows = _call(_client().checkpoints, job)
    table = Table("STEP", "STATE", "SIZE", "AGE", "ATTEMPT", "URI", "WHY")
    colors = {"good": "green", "bad": "red", "deleted": "dim"}
    for c in rows:
        state = f"[{colors[c['state']]}]{c['state']}[/]" if c["state"] in colors else c["state"]
        table.add_row(
            str(c["step"]),
            state,
            _bytes(c.get("size_bytes")),
            _age(c["created_at"]),
            c.get("attempt_id") or "",
            c["uri"],
            c.get("reason") or "",
        )
    console.print(table)


def ratings(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """Human eval ratings per checkpoint: mean score (1-5) and hallucination rate, from Slack."""
    rows = _call(_client().ratings, job)
    if not rows:
        console.print(f"no rated checkpoints for {job} (is the spec's eval section set?)")
        return
    table = Table(
        "STEP",
        "SAMPLES",
        "RATERS",
        "RATINGS",
        "MEAN SCORE",
        "HALLUCINATION",
        "COMPLETE",
        "URI",
        title=f"human eval of {job}",
    )
    for r in rows:
        mean = "-" if r["mean_score"] is None else f"{r['mean_score']:.2f}"
        rate = "-" if r["hallucination_rate"] is None else f"{r['hallucination_rate']:.0%}"
        table.add_row(
            str(r["step"]),
            f"{r['posted']}/{r['samples']}",
            str(r["raters"]),
            str(r["ratings"]),
            mean,
            rate,
            "[green]yes[/green]" if r["complete"] else "no",
            r["uri"],
        )
    console.print(table)
