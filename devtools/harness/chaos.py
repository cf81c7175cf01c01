"""The chaos run shared by tests/chaos and bench/chaos.py.

One job of the tiny trainer (2 nodes x 2 processes, checkpoints to the loopback S3 server) with a
schedule of faults: kill -9 of a rank, a SIGSTOP hang, a busy hang, a NaN loss (one per attempt,
so every restart makes progress; restarted in place or relaunched), then, in the last attempt, S3
made unreachable during a save (the server paused with SIGSTOP, then resumed) and kill -9 of the
control plane with a restart.
A reference run of the same config without faults gives the losses every attempt must reproduce.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts import FailureKind
from aerie_contracts.states import JOB_TERMINAL, JobState
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import rank_faults, rank_losses, trainer_spec

STEPS = 300
EVERY = 20
TRAINER_FAULTS = [*rank_faults(30, 50, 70), {"kind": "nan", "step": 90, "attempt": 4}]
# FSDP2: its reduce-scatters sum in a fixed order from the first step on. DDP rebuilds its gradient
# buckets after its first iteration, so at world size > 2 a resumed run's first step adds the
# ranks' gradients in another order than the uninterrupted run did (last-bit differences).
HPS = {"parallelism": "fsdp2"}
EXPECTED_REASONS = [FailureKind.EXIT_NONZERO, FailureKind.SILENT_HANG, FailureKind.SILENT_HANG, FailureKind.LOSS_NAN]


@dataclass
class ChaosResult:
    job: dict
    reference: dict[int, float]
    losses: dict[int, dict[int, float]]
    wall_s: float
    reference_wall_s: float
    timeline: list[tuple[float, str]] = field(default_factory=list)


def _s3_pid(home: Path) -> int:
    import json

    return int(json.loads((home / "devstack" / "s3.json").read_text())["pid"])


def _latest_step(cp: ControlPlane, job_id: str, attempt: int) -> int:
    losses = rank_losses(cp.home / "jobs", job_id).get(attempt, {})
    return max(losses) if losses else 0


def run_chaos(cp: ControlPlane, work: Path, bucket_prefix: str = "s3://aerie/chaos", steps: int = STEPS) -> ChaosResult:
    """The reference run, then the chaos run, both of `steps` steps (at least 200: the last attempt
    must still be training when the control plane comes back, about 20 steps after step 95)."""
    timeline: list[tuple[float, str]] = []

    def note(what: str) -> None:
        timeline.append((time.time(), what))

    # The reference: same config and world size, no faults (`same`: what the two runs share).
    same: dict[str, Any] = {"steps": steps, "extra_hps": HPS, "every_steps": EVERY}
    t0 = time.time()
    ref_spec = trainer_spec(work / "reference.json", "chaos-reference", checkpoint_uri=bucket_prefix + "-ref", **same)
    cp.cli("submit", str(ref_spec), check=True)
    ref_job = cp.wait_state("chaos-reference", {JobState.COMPLETED, JobState.FAILED}, timeout_s=600)
    assert ref_job["state"] == JobState.COMPLETED, ref_job
    reference = rank_losses(cp.home / "jobs", ref_job["id"])[1]
    reference_wall = time.time() - t0

    start = time.time()
    spec = trainer_spec(
        work / "chaos.json",
        "chaos",
        faults=TRAINER_FAULTS,
        checkpoint_uri=bucket_prefix,
        max_restarts=len(TRAINER_FAULTS),
        # Both restart modes: the rank kill and the NaN leave healthy nodes (in place, from the
        # newest memory checkpoint); each hang blames its node (relaunched without it).
        in_place_restarts=len(TRAINER_FAULTS),
        # The sigstop and the busy hang each blame the node that hosted the faulty rank, and a
        # blamed node is excluded: two spare slots keep the 2-node job placeable to the end.
        backend_options={"node_slots": 4},
        **same,
    )
    cp.cli("submit", str(spec), check=True)
    note("submitted")
    final_attempt = len(TRAINER_FAULTS) + 1
    deadline = time.time() + 1200
    job = cp.job("chaos")
    # Wait for the last attempt to train past its resume point, then break S3 and the control plane.
    while True:
        assert time.time() < deadline, "chaos job stalled"
        job = cp.job("chaos")
        assert job["state"] not in (JobState.FAILED, JobState.STOPPED), job
        attempts = job["attempt_list"]
        if len(attempts) == final_attempt and _latest_step(cp, job["id"], final_attempt) >= 95:
            break
        time.sleep(0.5)
    note("last attempt training")
    # S3 unreachable during a save: freeze the server across the next checkpoint, then thaw it.
    s3 = _s3_pid(cp.home)
    os.kill(s3, signal.SIGSTOP)
    note("s3 paused")
    pause_until = time.time() + 10
    while time.time() < pause_until:
        time.sleep(0.5)
    os.kill(s3, signal.SIGCONT)
    note("s3 resumed")
    # kill -9 of the control plane while the job runs, then a restart that re-adopts it.
    cp.kill9()
    note("control plane killed")
    time.sleep(3)
    cp.start()
    note(f"control plane restarted (the last attempt at step {_latest_step(cp, job['id'], final_attempt)})")
    job = cp.wait_state("chaos", JOB_TERMINAL, timeout_s=max(60, deadline - time.time()))
    note(f"job {job['state']}")
    losses = rank_losses(cp.home / "jobs", job["id"])
    return ChaosResult(
        job=job,
        reference=reference,
        losses=losses,
        wall_s=time.time() - start,
        reference_wall_s=reference_wall,
        timeline=timeline,
    )


def resume_step(attempt: dict) -> int:
    return attempt.get("resumed_step") or 0
