"""Goodput under chaos: useful training time / wall time, and per fault the time to detect and to resume.

Runs the chaos scenario of tests/chaos (a real control plane, 2 local nodes x 2 processes, the
tiny trainer with checkpoints to the loopback S3 server; kill -9 of a rank, SIGSTOP hang, busy
hang, NaN loss, an S3 outage during a save and kill -9 of the control plane) next to the same run
without faults, and prints one JSON line:
- measured goodput: the fault-free run's wall time / the chaos run's wall time (both include
  start-up, so the ratio is what the faults cost);
- per fault: time to detect (fault -> attempt failed) and time to resume (attempt failed -> next
  attempt's first step), plus the steps that had to be redone;
- the projection the goal is stated in: goodput for a run whose faults are an hour apart, at the
  measured recovery cost per fault (goal >= 95 %).

    .venv/bin/python bench/chaos.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aerie_contracts.states import JobState  # noqa: E402
from orchestrator.harness.chaos import TRAINER_FAULTS, run_chaos  # noqa: E402
from orchestrator.harness.control_plane import ControlPlane  # noqa: E402
from orchestrator.harness.jobs import rank_losses  # noqa: E402

FAULT_INTERVAL_S = 3600.0


def first_step_time(jobs_dir: Path, job_id: str, attempt: int) -> float | None:
    times = []
    for f in (jobs_dir / job_id / f"attempt-{attempt}").glob("algo-*/output/metrics/rank-00000.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") is None and rec.get("step") is not None:
                times.append(rec["t"])
                break
    return min(times) if times else None


def last_step_time(jobs_dir: Path, job_id: str, attempt: int) -> tuple[float, int] | None:
    best = None
    for f in (jobs_dir / job_id / f"attempt-{attempt}").glob("algo-*/output/metrics/rank-00000.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") is None and rec.get("step") is not None:
                best = (rec["t"], rec["step"])
    return best


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="aerie-bench-chaos-"))
    (work / "home").mkdir()
    cp = ControlPlane(work / "home", s3=True).start()
    try:
        result = run_chaos(cp, work)
    finally:
        cp.stop()
        cp.cleanup_nodes()
    job = result.job
    jobs_dir = work / "home" / "jobs"
    attempts = job["attempt_list"]
    per_fault = []
    for fault, failed, nxt in zip(TRAINER_FAULTS, attempts, attempts[1:]):
        healthy = last_step_time(jobs_dir, job["id"], failed["number"])
        resumed_first = first_step_time(jobs_dir, job["id"], nxt["number"])
        detect = failed["ended_at"] - healthy[0] if healthy else None
        resume = resumed_first - failed["ended_at"] if resumed_first else None
        per_fault.append(
            {
                "fault": fault["kind"],
                "reason": (failed.get("reason") or {}).get("kind"),
                "detect_s": round(detect, 2) if detect is not None else None,
                "resume_s": round(resume, 2) if resume is not None else None,
                "steps_redone": (healthy[1] - nxt["resumed_step"]) if healthy and nxt.get("resumed_step") else None,
            }
        )
    losses = rank_losses(jobs_dir, job["id"])
    step_s = result.reference_wall_s / max(result.reference)
    recoveries = [(f["detect_s"] or 0) + (f["resume_s"] or 0) + (f["steps_redone"] or 0) * step_s for f in per_fault]
    mean_recovery = statistics.mean(recoveries)
    projection = FAULT_INTERVAL_S / (FAULT_INTERVAL_S + mean_recovery)
    print(
        json.dumps(
            {
                "bench": "chaos",
                "job_state": job["state"],
                "attempts": len(attempts),
                "steps": max(losses[attempts[-1]["number"]]),
                "wall_s": round(result.wall_s, 1),
                "fault_free_wall_s": round(result.reference_wall_s, 1),
                "goodput_measured": round(result.reference_wall_s / result.wall_s, 3),
                "faults": per_fault,
                "mean_recovery_s": round(mean_recovery, 1),
                "goodput_projected_faults_1h_apart": round(projection, 4),
                "goal": 0.95,
                "meets_goal": projection >= 0.95,
                "note": "the measured goodput packs 5 faults into a run of about a minute of training; the projection "
                "spaces them an hour apart at the same recovery cost",
            }
        )
    )
    return 0 if job["state"] == JobState.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
