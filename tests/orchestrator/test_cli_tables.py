"""Acceptance 2 of issue 37: with stdout a file (no terminal, no COLUMNS), every table of the CLI
prints at the width of its content: each column header whole (no `ATTE…`, `REAS…`), each long
reason on one line. On a terminal, or with COLUMNS set, rich's width stands.

Real parts: the API over HTTP (uvicorn in this process, SQLite store, populated directly: a job
whose first attempt hung with long reasons, verdicts, blames, pre-flight results and a bad
checkpoint), and the CLI in a process of its own whose stdout is a file.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from aerie_contracts import restarts
from aerie_contracts.failures import BlameRule, FailureKind
from orchestrator import goodput_view
from orchestrator.cli import output
from orchestrator.store import repo

REPO = Path(__file__).parents[2]

LONG_HANG = (
    "no rank of algo-1 advanced past step 150 for 15.0s while its peers waited in all_reduce "
    "(py-spy: ranks 0-1 busy in a Python loop, GPU idle); the node agent's watchdog raised silent.hang"
)
LONG_MODE_REASON = "algo-1 is blamed and excluded (stalest), so the memory tier cannot restart in place"
LONG_BAD = "verification failed: shard __1_0.distcp is missing (manifest lists 2 shards, 1 found in S3)"
RESUME = "s3://aerie-checkpoints-of-a-long-bucket-name/ckpt/tables/step_00000100/attempt_0001"

# Every table each command prints, by its headers, as orchestrator/cli/ and goodput_view.py build them.
TABLES = {
    "ls": [["ID", "NAME", "STATE", "BACKEND", "ATTEMPTS", "AGE", "REASON"]],
    "describe": [
        ["ATTEMPT", "STATE", "REASON", "EXIT", "RESTART", "RESUMED FROM", "NODES", "SPARES", "EXCLUDED", "DURATION"],
        ["PRE-FLIGHT", "ATTEMPT", "HOST", "TOOK", "CHECKS", "WHY"],
        ["VERDICT", "ATTEMPT", "HOST", "MESSAGE"],
        ["BLAMED NODE", "ATTEMPT", "FOR", "WHY", "STATUS"],
    ],
    "events": [["SEQ", "TIME", "TYPE", "DETAIL", "DELIVERY"]],
    "checkpoints": [["STEP", "STATE", "SIZE", "AGE", "ATTEMPT", "URI", "WHY"]],
    "goodput": [
        ["CATEGORY", "NODE-TIME", "PER NODE", "SHARE"],
        [str(c.header) for c in goodput_view.faults_table([]).columns],
    ],
    "token list": [["ID", "ROLE", "TENANT", "NAME", "AGE", "EXPIRES", "REVOKED", "AWS ACCESS KEY"]],
    "backends": [["BACKEND", "REACHABLE", "DETAIL"]],
}

# One process, its stdout a file: each command as `aerie` runs it (the entry point is `orchestrator.cli:app`).
DRIVER = """
import sys
from orchestrator.cli import app
for command in sys.argv[1:]:
    print("=== " + command, flush=True)
    app(command.split(), prog_name="aerie", standalone_mode=False)
    sys.stdout.flush()
"""


def _preflight(host: str, passed: bool) -> dict:
    checks = [
        {"check": "compute", "passed": True, "value": 1234.5, "threshold": 0.5, "unit": "GFLOP/s"},
        {"check": "store", "passed": True, "value": 0.021, "threshold": 5, "unit": "s"},
        {
            "check": "nccl",
            "passed": passed,
            "value": 0.3 if not passed else 41.0,
            "threshold": 2,
            "unit": "GB/s",
            "reason": "all_reduce bus bandwidth 0.3 GB/s < 2 GB/s between algo-3 and its peers",
        },
    ]
    return {"host": host, "passed": passed, "checks": checks, "elapsed_s": 3.2}


def _job_with_history(api) -> str:
    spec = {"name": "tables", "backend": "local", "resources": {"instance_count": 2, "spare_nodes": 1}}
    with api.db.session() as s:
        done = repo.create_job(s, {**spec, "name": "an-earlier-run-of-the-tables-job-with-a-long-name"}, "default")
        repo.set_job_state(s, done, "Failed", {"kind": FailureKind.CHECKPOINT_FAILED, "message": LONG_BAD})
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        a1 = repo.create_attempt(s, job, 1)
        a1.handle = {"hosts": ["algo-1", "algo-2"], "spares": ["algo-3"]}
        repo.set_attempt_state(s, a1, "Running")
        # 150 steps in the 15 s before the hang, for the goodput ledger's faults table.
        job.created_at, a1.created_at, a1.started_at = (t - 30 for t in (job.created_at, a1.created_at, a1.started_at))
        repo.record_metrics(s, a1, [{"step": i, "t": a1.started_at + 2 + i * 0.1} for i in range(1, 151)])
        for host in ("algo-1", "algo-2"):
            repo.record_preflight(s, a1, host, _preflight(host, True))
            repo.record_heartbeat(s, a1, host, {"last_step": 150})
        repo.record_spare_preflight(s, a1, "algo-3", _preflight("algo-3", False))
        repo.record_checkpoint(s, a1, 100, RESUME, {"save_s": 1.5})
        repo.record_verdict(s, a1, "algo-1", FailureKind.SILENT_HANG, LONG_HANG, {})
        repo.record_blames(
            s,
            a1,
            [{"host": "algo-1", "kind": FailureKind.SILENT_HANG, "rule": BlameRule.STALEST, "why": LONG_HANG}],
        )
        reason = {"kind": FailureKind.SILENT_HANG, "host": "algo-1", "message": LONG_HANG}
        repo.set_attempt_state(s, a1, "Failed", reason, exit_code=1)
        repo.set_checkpoint_state(s, job, [RESUME], "bad", LONG_BAD)
        a2 = repo.create_attempt(s, job, 2, resume_from=RESUME, exclude_nodes=["algo-1"])
        a2.cause = {restarts.CAUSE_MODE: "relaunch", restarts.CAUSE_MODE_REASON: LONG_MODE_REASON}
        a2.handle = {"hosts": ["algo-2", "algo-3"]}
        repo.set_attempt_state(s, a2, "Running")
        return job.id


def _header_rows(text: str) -> list[list[str]]:
    """The cells of each table's header row (rich's heavy head: `┃ A ┃ B ┃`)."""
    return [[c.strip() for c in line.strip().strip("┃").split("┃")] for line in text.splitlines() if "┃" in line]


def _sections(out: str, job_id: str) -> dict[str, str]:
    """Each command's output, by the command without its job id."""
    parts = out.split("=== ")[1:]
    return {p.split("\n", 1)[0].replace(job_id, "").strip(): p for p in parts}


@pytest.fixture
def api(live_api):
    return live_api


def test_every_table_prints_whole_when_stdout_is_a_file(api, tmp_path):
    job_id = _job_with_history(api)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update({"AERIE_API": api.url, "AERIE_TOKEN": api.admin})
    commands = ["ls", f"describe {job_id}", f"events {job_id}", f"checkpoints {job_id}", f"goodput {job_id}"]
    commands += ["token list", "backends"]
    out_path = tmp_path / "out.txt"
    with out_path.open("w") as stdout:
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, *commands],
            stdin=subprocess.DEVNULL,  # rich would take a terminal's width from stdin, too
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
        )
    out = out_path.read_text()
    assert proc.returncode == 0, proc.stderr + out
    assert "…" not in out, out
    sections = _sections(out, job_id)
    assert set(sections) == set(TABLES), sections.keys()
    for command, tables in TABLES.items():
        headers = _header_rows(sections[command])
        for table in tables:
            assert table in headers, f"aerie {command}: {table} not whole in {headers}\n{sections[command]}"
    # Long cells stay on one line: the table takes its content's width, well past 80 columns.
    describe = sections["describe"]
    assert LONG_HANG in describe and RESUME in describe and LONG_MODE_REASON in describe, describe
    assert max(len(line) for line in describe.splitlines()) > len(LONG_HANG) > 80
    assert LONG_BAD in sections["checkpoints"] and RESUME in sections["checkpoints"]
    assert "checkpoint.failed" in sections["ls"] and "an-earlier-run-of-the-tables-job-with-a-long-name" in out
    assert "FailureKind" not in out


class _Stream(io.StringIO):
    def __init__(self, isatty: bool) -> None:
        super().__init__()
        self._isatty = isatty

    def isatty(self) -> bool:
        return self._isatty


def _attempts_table(monkeypatch, columns: str | None, isatty: bool) -> tuple[str, int, int]:
    """`aerie describe`'s attempts table as the CLI's console prints it on a stream that is (or is
    not) a terminal, with COLUMNS set or not: (the text, the console's width, plain rich's)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    stream = _Stream(isatty)
    table = Table(*TABLES["describe"][0])
    table.add_row("1", "Failed", "silent.hang", "1", "relaunch", RESUME, "algo-1:Failed, algo-2:Failed", "", "", "9s")
    console = output._FreshConsole(file=stream, color_system=None)
    console.print(table)
    return stream.getvalue(), console.width, Console(file=stream).width


def test_columns_set_or_a_terminal_keep_richs_width(monkeypatch):
    in_a_file, width, _ = _attempts_table(monkeypatch, None, isatty=False)
    assert width == output.UNBOUNDED_WIDTH and RESUME in in_a_file
    assert _header_rows(in_a_file)[0] == TABLES["describe"][0]
    narrow, width, rich_width = _attempts_table(monkeypatch, "80", isatty=False)  # COLUMNS, as rich reads it
    assert width == rich_width == 80 and max(len(line) for line in narrow.splitlines()) <= 80
    _, width, rich_width = _attempts_table(monkeypatch, None, isatty=True)  # the terminal's own width
    assert width == rich_width < output.UNBOUNDED_WIDTH
