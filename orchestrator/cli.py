"""`aerie`: the command line. Talks to the API over HTTP; `aerie up` runs the control plane.

Over 400 lines on purpose: the whole command surface in one place, one short function per command
(typer reads each signature as that command's --help); the work behind them is in the API.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from aerie_contracts import env, preflight, restarts
from aerie_contracts.states import JOB_TERMINAL, AttemptState, JobState
from orchestrator import follow, goodput_view
from orchestrator.client import ApiError, Client
from orchestrator.sagemaker_mapping import spec_from_document
from orchestrator.spec import SpecError, format_validation_error, load_document

app = typer.Typer(
    help="Aerie: run LLM training jobs that recover from silent failures by themselves.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


# The width when the output is not a terminal: wide enough that every table takes its natural width.
UNBOUNDED_WIDTH = 10_000


class _FreshConsole:
    """rich's Console, made anew at each use: the width (COLUMNS) and the stream are read when
    printing, not when the module was imported (the CLI also runs in-process, under test runners
    and in the demo).

    Written to a file or a pipe, rich would squeeze every table to 80 columns (or to the width of
    whatever terminal stdin happens to be) and cut its headers (`ATTE…`); there the console is
    unbounded instead, so a table prints at the width of its content and a line is not wrapped.
    On a terminal, or with COLUMNS set, rich's width stands as it is."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    def _console(self) -> Console:
        console = Console(**self._options)
        explicit = "width" in self._options or os.environ.get("COLUMNS", "").isdigit()
        if not explicit and not _isatty(console.file):
            console.width = UNBOUNDED_WIDTH
        return console


def _isatty(stream: Any) -> bool:
    """Whether the stream is a terminal, whatever rich is told (FORCE_COLOR makes it colour a pipe,
    not size it): only a terminal has a width to fit."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


console = _FreshConsole()
err = _FreshConsole(stderr=True)

TERMINAL = JOB_TERMINAL


def _client() -> Client:
    try:
        return Client()
    except ApiError as exc:
        _die(str(exc))


def _die(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        _die(str(exc))


def _age(t: float | None) -> str:
    if not t:
        return "-"
    s = int(time.time() - t)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


# --- control plane ---------------------------------------------------------------------------


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


@app.command()
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


# --- jobs ------------------------------------------------------------------------------------


@app.command()
def submit(
    spec_path: Path = typer.Argument(
        ..., metavar="SPEC", help="Job spec (YAML/JSON) or a CreateTrainingJob request (JSON)."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Stream logs until the job ends; exit 0 only if it completed."
    ),
    name: str | None = typer.Option(None, help="Override the spec's name."),
    backend: str | None = typer.Option(None, help="Override the spec's backend: local, slurm or sagemaker."),
    fault: list[str] = typer.Option(
        [],
        "--fault",
        metavar="KIND@STEP[:rank=R][:attempt=N]",
        help="Inject a fault to rehearse recovery (repeatable): nan, busy_hang, "
        "sigstop, sigkill, exit, slow, spike. E.g. --fault busy_hang@30:rank=1",
    ),
) -> None:
    """Submit a job. The spec is checked here first, so every bad field is named at once."""
    try:
        data = load_document(spec_path)
        if name:
            data["name" if "AlgorithmSpecification" not in data else "TrainingJobName"] = name
        spec = spec_from_document(data)
    except SpecError as exc:
        _die(str(exc), 2)
    except ValidationError as exc:
        _die(f"{spec_path} is not a valid job spec:\n{format_validation_error(exc)}", 2)
    if backend:
        spec = spec.model_copy(update={"backend": backend})
    if fault:
        from trainer.faults import parse_cli

        try:
            faults = [parse_cli(f) for f in fault]
        except ValueError as exc:
            _die(str(exc), 2)
        spec = spec.model_copy(update={"env": {**spec.env, env.FAULTS: json.dumps(faults)}})
    if spec.backend in ("local", "slurm") and "workdir" not in spec.backend_options:
        # Like SkyPilot's workdir: local and Slurm nodes (shared filesystem) run the code from where you submitted.
        spec = spec.model_copy(update={"backend_options": {**spec.backend_options, "workdir": os.getcwd()}})
    client = _client()
    job = _call(client.submit, spec.model_dump(mode="json"))
    console.print(
        f"submitted [bold]{job['id']}[/bold] ({spec.resources.instance_count} node(s) x "
        f"{spec.resources.procs_per_node} process(es), backend {spec.backend})"
    )
    if follow:
        state = _follow(client, job["id"], condense=True)
        raise typer.Exit(0 if state == JobState.COMPLETED else 1)


@app.command("ls")
def list_jobs(state: str | None = typer.Option(None, help="Only jobs in this state.")) -> None:
    """List jobs, newest first."""
    jobs = _call(_client().jobs, state)
    table = Table("ID", "NAME", "STATE", "BACKEND", "ATTEMPTS", "AGE", "REASON")
    for j in jobs:
        reason = (j.get("reason") or {}).get("kind", "")
        table.add_row(
            j["id"], j["name"], _state(j["state"]), j["backend"], str(j["attempts"]), _age(j["created_at"]), reason
        )
    console.print(table)


@app.command()
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


@app.command()
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


@app.command()
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


@app.command()
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


@app.command()
def chaos(
    job: str = typer.Argument(..., help="Job id or name."),
    node: int = typer.Option(..., "--node", help="The node's rank in the running attempt (0 = first host)."),
    rank: int | None = typer.Option(
        None, "--rank", help="The global rank on that node (sigstop, sigkill and freeze are done to one rank)."
    ),
    fault: str = typer.Option(
        ...,
        "--fault",
        help="sigstop | sigkill | freeze (one rank); slow-nic (the node's NIC, nodes in network namespaces); "
        "node-loss (the whole node dies at once and its memory is gone; local backend)",
    ),
) -> None:
    """Do a fault to one real rank, or to a whole node, of a running job, from the outside (audited as an event)."""
    r = _call(_client().chaos, job, node, rank, fault)
    target = f"rank {r['rank']} on {r['host']}" if r.get("rank") is not None else r["host"]
    console.print(f"{fault} requested for {target} ({r['attempt_id']}, request {r['id']})")


@app.command()
def stop(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """Stop a job: its nodes get SIGTERM, then SIGKILL after a grace period."""
    j = _call(_client().stop, job)
    console.print(f"stopping {j['id']} (state {j['state']})")


@app.command()
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


def _bytes(n: int | None) -> str:
    """A size as people read it (decimal units, like S3's console)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(n)


@app.command()
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


token_app = typer.Typer(help="API tokens: create (shown once), list, revoke. Admin tokens only.", no_args_is_help=True)
app.add_typer(token_app, name="token")


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
    t = _call(client.request, "POST", "/v1/tokens", json={k: v for k, v in body.items() if v is not None})
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
    rows = _call(_client().request, "GET", "/v1/tokens")
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
    t = _call(_client().request, "DELETE", f"/v1/tokens/{token_id}")
    console.print(f"revoked token {t['id']} ({t['role']}, {t['name'] or 'unnamed'})")


def _state(state: str) -> str:
    color = {
        JobState.COMPLETED: "green",
        JobState.FAILED: "red",
        JobState.STOPPED: "yellow",
        JobState.IN_PROGRESS: "cyan",
        AttemptState.RUNNING: "cyan",
    }.get(state)
    return f"[{color}]{state}[/{color}]" if color else state


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
        if state in TERMINAL:
            if current is not None:
                ended(current)
            break
        time.sleep(1.0)
    reason = j.get("reason") or {}
    console.print(
        f"job {j['id']}: {_state(state)}" + (f" ({reason.get('kind')}: {reason.get('message', '')})" if reason else "")
    )
    return state


@app.command()
def ratings(job: str = typer.Argument(..., help="Job id or name.")) -> None:
    """Human eval ratings per checkpoint: mean score (1-5) and hallucination rate, from Slack."""
    rows = _call(_client().request, "GET", f"/v1/jobs/{job}/ratings")
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


if __name__ == "__main__":  # pragma: no cover
    app()
