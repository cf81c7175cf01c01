"""Recovery, side by side (issue #22): the same rank faults under `relaunch + S3` and `in place +
memory`, timed per fault from the job's own records. Shared by bench/chaos.py.

One job per policy, 2 nodes x 2 ranks of the tiny trainer, S3 every `S3_EVERY` steps; one fault
per attempt (a rank killed, a rank stopped, a rank spinning), each off the checkpoint boundaries so
redone work shows. Nodes are never excluded (`exclude_after_blames` high): these are rank faults
on healthy nodes, the case an in-place restart is for, and both policies get the same nodes.

Per fault, from the failed attempt's and its successor's metrics streams and records:
- detect_s: the failed attempt's last step -> the verdict (its reason's time: the agent's verdict,
  or the rank's death);
- restart_s: the verdict -> the new ranks begin their restore (teardown, the decision, launch or
  warm ranks' go, rendezvous, model build);
- restore_s: the ranks' restore (the slowest rank's `restored` event);
- redone_steps / redone_s: steps trained again after the resume point (at the run's median step time);
- phases: where restart_s goes, seconds after the verdict, from the attempt rows and the nodes'
  logs (the slowest node's): `announced` (attempt N+1 created), `reaped` (the old group ended and
  the node reported), `learned` (the agent switched to N+1), `spawned` (the new ranks started),
  `pg_init` (their process group up), `restored`, `first_step`;
and per policy the median step time, so snapshot overhead is measured in the same run against a
policy with snapshots off (plus the snapshots' own cost share, from their `checkpoint_memory` events).
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.metrics import MetricEvent
from aerie_contracts.states import JOB_TERMINAL
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import attempt_step_records, rank_faults, trainer_spec

STEPS = 400
S3_EVERY = 20
MEMORY_EVERY = 5
# A hundred steps apart (about 5 s of the tiny model's training here), and the first a hundred
# steps in: time for a group's warm successor (agent.warm, started at the agent's first heartbeat
# that shows a step) to be ready, as it is in a real run, whose faults are hours apart.
FAULTS = rank_faults(157, 257, 357)
POLICIES: dict[str, dict[str, Any]] = {
    "relaunch + S3": {"in_place_restarts": 0, "memory_every_steps": 0},
    # The same in-place job with snapshots off: the baseline their overhead is measured against
    # (the relaunch job differs in more than snapshots: no warm groups, other restarts).
    "in place, no snapshots": {"in_place_restarts": len(FAULTS), "memory_every_steps": 0},
    "in place + memory": {"in_place_restarts": len(FAULTS), "memory_every_steps": MEMORY_EVERY},
    # The default interval: as often as the measured cost allows within 1 % of step time.
    "in place + memory (auto)": {"in_place_restarts": len(FAULTS), "memory_every_steps": "auto"},
}


@dataclass
class PolicyRun:
    policy: str
    job: dict[str, Any]
    wall_s: float
    fault_list: list[dict[str, Any]] = field(default_factory=lambda: list(FAULTS))
    faults: list[dict[str, Any]] = field(default_factory=list)
    median_step_s: float | None = None
    snapshot_share: float | None = None  # snapshot seconds / step seconds, rank 0


def select_faults(kinds: list[str] | None) -> tuple[list[dict[str, Any]], int]:
    """The faults of these kinds (all: None), renumbered one per attempt, and the steps a job with
    them needs (its last fault + 43, as the full set's)."""
    chosen = [dict(f) for f in FAULTS if kinds is None or f["kind"] in kinds]
    if not chosen:
        raise ValueError(f"no fault of kinds {kinds}; known: {[f['kind'] for f in FAULTS]}")
    for n, fault in enumerate(chosen, 1):
        fault["attempt"] = n
    return chosen, max(f["step"] for f in chosen) + STEPS - FAULTS[-1]["step"]


def run_policy(
    cp: ControlPlane,
    work: Path,
    policy: str,
    bucket: str = "s3://aerie/recovery",
    *,
    kinds: list[str] | None = None,
    suffix: str = "",
) -> PolicyRun:
    """One job under `policy` (a key of POLICIES), to its end; only the faults of `kinds` (all: None)."""
    faults, steps = select_faults(kinds)
    every = POLICIES[policy]["memory_every_steps"]
    in_place = POLICIES[policy]["in_place_restarts"]
    kind = "memory-auto" if every == "auto" else "memory" if every else "in-place" if in_place else "s3"
    name = "recovery-" + kind + suffix
    path = trainer_spec(
        work / f"{name}.json",
        name,
        steps=steps,
        faults=faults,
        checkpoint_uri=f"{bucket}/{name}",
        every_steps=S3_EVERY,
        max_restarts=len(faults),
        in_place_restarts=POLICIES[policy]["in_place_restarts"] and len(faults),
        memory_every_steps=POLICIES[policy]["memory_every_steps"],
    )
    spec = json.loads(path.read_text())
    spec["retry"]["exclude_after_blames"] = 100
    path.write_text(json.dumps(spec))
    started = time.time()
    cp.cli("submit", str(path), check=True)
    job = cp.wait_state(name, JOB_TERMINAL, timeout_s=900)
    run = PolicyRun(policy=policy, job=job, wall_s=time.time() - started, fault_list=faults)
    measure(run, cp.home / "jobs" / job["id"])
    return run


def measure(run: PolicyRun, job_dir: Path) -> None:
    """Fill `run.faults`, the median step time and the snapshot share from the job's records."""
    attempts = sorted(run.job["attempt_list"], key=lambda a: a["number"])
    steps = [r for a in attempts for r in attempt_step_records(job_dir, a["number"])]
    step_times = [float(r["step_s"]) for r in steps if isinstance(r.get("step_s"), (int, float))]
    run.median_step_s = statistics.median(step_times) if step_times else None
    snaps = [
        float(r["snapshot_s"])
        for a in attempts
        for r in attempt_step_records(job_dir, a["number"], 0, MetricEvent.CHECKPOINT_MEMORY)
        if isinstance(r.get("snapshot_s"), (int, float))
    ]
    if step_times and snaps:
        run.snapshot_share = sum(snaps) / sum(step_times)
    for fault, failed, nxt in zip(run.fault_list, attempts, attempts[1:], strict=False):
        run.faults.append(fault_timings(fault, failed, nxt, job_dir, run.median_step_s))


def fault_timings(
    fault: dict[str, Any], failed: dict[str, Any], nxt: dict[str, Any], job_dir: Path, step_s: float | None
) -> dict[str, Any]:
    last = max(attempt_step_records(job_dir, failed["number"]), key=lambda r: r["step"], default=None)
    restored = attempt_step_records(job_dir, nxt["number"], None, MetricEvent.RESTORED)
    out: dict[str, Any] = {
        "fault": fault["kind"],
        "reason": (failed.get("reason") or {}).get("kind"),
        "mode": (nxt.get("cause") or {}).get("mode"),
        "resumed_from": nxt.get("resume_from"),
    }
    # The verdict's own time (an agent's, or a rank's death), else when the attempt was recorded failed.
    at = (failed.get("reason") or {}).get("at")
    verdict = float(at) if isinstance(at, (int, float)) else failed.get("ended_at")
    if last is not None and verdict:
        out["detect_s"] = round(verdict - last["t"], 2)
    if restored and verdict:
        restore_s = max(float(r.get("restore_s") or 0) for r in restored)
        began = min(float(r["t"]) - float(r.get("restore_s") or 0) for r in restored)
        out["restart_s"] = round(began - verdict, 2)
        out["restore_s"] = round(restore_s, 2)
        out["restart_plus_restore_s"] = round(out["restart_s"] + restore_s, 2)
    # The point the ranks really restored (a memory point's fallback, if they took it).
    resumed = step_of_uri((restored[0].get("uri") if restored else None) or nxt.get("resume_from") or "") or 0
    out["resumed_step"] = resumed
    if last is not None:
        out["redone_steps"] = int(last["step"]) - resumed
        if step_s:
            out["redone_s"] = round(out["redone_steps"] * step_s, 2)
    if verdict:
        out["phases"] = phases(job_dir, float(verdict), nxt)
    return out


# Node-log lines that mark the phases of a restart (agent/supervisor.py, agent/memckpt, trainer/train.py).
_PHASE_LINES = {
    "reaped": re.compile(r"\] INFO node \S+ finished: exit"),
    "learned": re.compile(r"restarts its worker group in place for|INFO memory checkpoints: \S+ serves replicas"),
    "spawned": re.compile(r"\] INFO starting \d+ rank"),
    "pg_init": re.compile(r"INFO trainer\.train: process group:"),
}
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _stamp(line: str) -> float | None:
    match = _STAMP.search(line)
    if not match:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged


def phases(job_dir: Path, verdict: float, nxt: dict[str, Any]) -> dict[str, float]:
    """Seconds after the verdict at which each restart phase was over on the slowest node."""
    out: dict[str, float] = {}
    if isinstance(nxt.get("created_at"), (int, float)):
        out["announced"] = round(float(nxt["created_at"]) - verdict, 2)
    for log_path in sorted(job_dir.glob("attempt-*/*/logs/node.log")):
        seen: dict[str, float] = {}
        for line in log_path.read_text(errors="replace").splitlines():
            t = _stamp(line)
            if t is None or t < verdict - 0.5:
                continue
            for phase, pattern in _PHASE_LINES.items():
                if phase not in seen and pattern.search(line):
                    seen[phase] = t - verdict
        for phase, dt in seen.items():
            out[phase] = round(max(out.get(phase, dt), dt), 2)
    restored = attempt_step_records(job_dir, nxt["number"], None, MetricEvent.RESTORED)
    if restored:
        out["restored"] = round(max(float(r["t"]) for r in restored) - verdict, 2)
    first = attempt_step_records(job_dir, nxt["number"])
    if first:
        out["first_step"] = round(min(float(r["t"]) for r in first) - verdict, 2)
    return dict(sorted(out.items(), key=lambda kv: kv[1]))
