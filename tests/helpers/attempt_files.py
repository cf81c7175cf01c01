"""What an attempt's nodes leave on disk, read by the whole-job tests: rank and agent pids, the
ranks' `restored` events, the requests the loopback S3 server logged since a mark, and the job's
processes still running."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil

from aerie_contracts import env
from aerie_contracts.checkpoints import CheckpointTier, memory_uri
from aerie_contracts.metrics import MetricEvent
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import event_records
from tests.helpers.s3_requests import _LINE
from tests.helpers.wait import wait_for


def pids(folder: Path, pattern: str) -> set[int]:
    """The pids in the JSON files matching `pattern` under `folder` (`agent.pid`, `ranks/rank-*.pid`)."""
    out = set()
    for f in folder.glob(pattern):
        try:
            out.add(int(json.loads(f.read_text())))
        except (OSError, ValueError, TypeError):
            pass
    return out


def restored_events(attempt_dir: Path, nodes: str = "algo-*") -> list[dict]:
    """The `restored` events of the live metrics stream of every rank under an attempt directory
    (`nodes`: its node folders, e.g. `node*` on Slurm)."""
    return event_records(attempt_dir, MetricEvent.RESTORED, nodes)


def s3_requests_since(log: Path, mark: int, *, ignore_attempt: int | None = None) -> list[str]:
    """The request lines the S3 server logged after byte `mark` of its log; `ignore_attempt`: less
    that attempt's own checkpoint objects (`.../attempt_NNNN/`): a restore reads what an earlier
    attempt wrote, and the restored ranks may already be saving their next checkpoint."""
    time.sleep(0.3)  # the server logs a request after answering it
    lines = [m.group(0) for m in _LINE.finditer(log.read_bytes()[mark:].decode("utf-8", "replace"))]
    own = f"/attempt_{ignore_attempt:04d}/" if ignore_attempt is not None else None
    return [line for line in lines if own is None or own not in line]


def s3_reads_since(log: Path, mark: int) -> list[str]:
    """The reads (GET, HEAD: objects and listings) the S3 server logged after byte `mark`: what a
    restore asks of S3. Writes are left out: a node that was just lost, or a survivor whose
    collective broke, may still finish (or mark `BAD`) the upload it had under way, and that is
    no request of the restore's."""
    return [line for line in s3_requests_since(log, mark) if (m := _LINE.match(line)) and m.group(1) in ("GET", "HEAD")]


def s3_restore_reads_since(log: Path, mark: int, attempt: int) -> list[str]:
    """The reads after `mark` that a restore of attempt `attempt` from S3 would make: of the
    checkpoint objects earlier attempts wrote (`.../attempt_<N>/...`, N < attempt), leaving out
    their `manifest.json`. Left out too, as no request of a restore: the control plane's own check
    of the durable fallback (a listing and the manifest; made before it creates the attempt and, on
    a loaded host, again after it: a redelivered failure event is decided again, refused with 409),
    and the new attempt's own saves (a DCP write HEADs its `.metadata` first), which may already
    run by the time the restore is checked."""
    out = []
    for r in s3_reads_since(log, mark):
        written_by = re.search(r"/attempt_(\d+)/", r)
        if written_by and int(written_by.group(1)) < attempt and "/manifest.json " not in r:
            out.append(r)
    return out


def attempt_of(cp: ControlPlane, job: str, n: int) -> dict | None:
    """Attempt number `n` of `job` as the API shows it, or None before it exists."""
    attempts = cp.job(job)["attempt_list"]
    return attempts[n - 1] if len(attempts) >= n else None


def good_memory(cp: ControlPlane, job_id: str, step: int, number: int) -> bool:
    """Whether a memory checkpoint of `step` or newer written by attempt `number` is recorded good
    (an older one is `deleted` as soon as a newer one is good: the agents keep only the newest)."""
    rows = cp.get(f"/v1/jobs/{job_id}/checkpoints")
    return any(
        r["tier"] == CheckpointTier.MEMORY
        and r["state"] == "good"
        and r["step"] >= step
        and r["uri"] == memory_uri(job_id, r["step"], number)
        for r in rows
    )


def good_s3(cp: ControlPlane, job_id: str, step: int) -> bool:
    """Whether an S3 checkpoint of `step` or newer is recorded good."""
    rows = cp.get(f"/v1/jobs/{job_id}/checkpoints")
    return any(r["tier"] == CheckpointTier.S3 and r["state"] == "good" and r["step"] >= step for r in rows)


def running_pids(agents: dict[str, Path], ranks_per_node: int) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Once every node's ranks run: each node's agent pid and rank pids."""
    wait_for(
        what="the nodes' ranks",
        check=lambda: all(len(pids(d, "ranks/rank-*.pid")) == ranks_per_node for d in agents.values()),
        timeout_s=120,
    )
    return {h: pids(d, "agent.pid") for h, d in agents.items()}, {
        h: pids(d, "ranks/rank-*.pid") for h, d in agents.items()
    }


def job_processes(job_id: str) -> list[int]:
    """Pids of every process that carries the job's id in its environment (`AERIE_JOB`): its
    agents, launchers and ranks, wherever the backend started them."""
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info.get("environ") or {}).get(env.JOB) == job_id:
                found.append(p.pid)
        except psutil.Error:
            pass
    return found
