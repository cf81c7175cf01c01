"""The hot-spare scenario of issue #23 (acceptance 1), for bench/chaos.py: a 2-node x 2-rank job of
the tiny trainer with `resources.spare_nodes: 1`; once its first memory checkpoint is good, node
algo-2's whole tree is SIGKILLed and its shared memory removed; the spare (algo-3) takes its slot
in place. Measures the time from the node's death to the first training step after.
(tests/e2e/test_spares.py asserts the same run step by step.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aerie_contracts.checkpoints import CheckpointTier, memory_uri
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES
from aerie_contracts.states import JOB_TERMINAL
from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import FAST_HEALTH, attempt_step_records, s3_spec
from devtools.harness.wait import wait_for

STEPS, S3_EVERY, MEM_EVERY = 40, 10, 10


def run_spare(cp: ControlPlane, work: Path, name: str = "spare") -> dict[str, Any]:
    path = s3_spec(work, name, steps=STEPS, s3_every=S3_EVERY, memory_every=MEM_EVERY, max_restarts=3, spare_nodes=1)
    job_id = cp.submit(path, name)
    root = cp.home / "jobs" / job_id / "attempt-1"
    want = memory_uri(job_id, MEM_EVERY, 1)

    def good() -> bool:
        rows = cp.get(f"/v1/jobs/{job_id}/checkpoints")
        assert isinstance(rows, list)
        return any(r["uri"] == want and r["state"] == "good" and r["tier"] == CheckpointTier.MEMORY for r in rows)

    wait_for(good, 180, "the first memory checkpoint")
    # algo-2 lost as a user would lose it (`aerie chaos --fault node-loss`: the local backend
    # SIGKILLs the node's whole tree and removes its shared-memory area as the last thing the
    # call does, so the loss is timed from its answer, not from the CLI's start).
    cp.cli("chaos", job_id, "--node", "1", "--fault", "node-loss", check=True)
    died_at = time.time()
    # Attempt 2's stream only once rank 0's agent set attempt 1's aside (until then "metrics" is 1's).
    switched = root / "algo-1" / "output" / "metrics.attempt-1"
    first = wait_for(
        lambda: switched.exists() and attempt_step_records(cp.home / "jobs" / job_id, 2), 180, "attempt 2's first step"
    )[0]
    job = cp.wait_state(name, JOB_TERMINAL, timeout_s=300)
    second = next((a for a in job["attempt_list"] if a["number"] == 2), {})
    spare_log = (root / "algo-3" / "logs" / "node.log").read_text(errors="replace")
    return {
        "job_state": job["state"],
        "death_to_first_step_s": round(float(first["t"]) - died_at, 1),
        "first_step_after": first["step"],
        "mode": (second.get("cause") or {}).get(CAUSE_MODE),
        "replaced_nodes": (second.get("cause") or {}).get(CAUSE_REPLACED_NODES),
        "resume_from": second.get("resume_from"),
        "spare_restored_from_replica": spare_log.count("restoring from the replica copy") == 2,
        "heartbeat_s": FAST_HEALTH["heartbeat_s"],
    }
