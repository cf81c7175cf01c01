"""Issue #22, in-place restart on the local backend, end to end: 2 nodes x 2 ranks of the tiny
trainer with S3 checkpoints (the loopback S3 server), one job, three attempts:

1. rank 3 (node algo-2) dies of SIGKILL at step 12 -> chaining restarts **in place**: the same
   agent processes, a new worker group (new rank pids), resuming from the last good checkpoint (S3's
   step 5 or 10, or a newer memory one);
2. in attempt 2, node algo-2 is killed whole (agent and ranks, SIGKILL) -> `node.lost` ->
   a **relaunch**: new agents in a new attempt directory, resuming from attempt 2's checkpoint;
3. attempt 3 completes.
"""

from __future__ import annotations

import json
import time

import pytest

from aerie_checkpoint import manifest
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.restarts import CAUSE_MODE, RestartMode
from devtools.harness.jobs import s3_spec, step_records
from orchestrator.backends import local_fence
from tests.helpers.attempt_files import attempt_of, pids, running_pids
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

STEPS, EVERY, CRASH = 40, 5, 12


def test_a_rank_crash_restarts_in_place_and_a_lost_node_relaunches(s3_plane, tmp_path):
    cp = s3_plane
    crash = [{"kind": "sigkill", "step": CRASH, "rank": 3, "attempt": 1}]
    job_id = cp.submit(s3_spec(tmp_path, "warm", steps=STEPS, s3_every=EVERY, max_restarts=2, faults=crash), "warm")
    root = cp.home / "jobs" / job_id / "attempt-1"
    agents = {h: root / h / "agent" for h in ("algo-1", "algo-2")}

    def attempt(n: int) -> dict | None:
        return attempt_of(cp, "warm", n)

    agent_pids, rank_pids = running_pids(agents, 2)

    # 1. The crash: attempt 2 in place, on the same agents, with new ranks.
    failed = wait_for(
        what="attempt 1 failed", check=lambda: (a := attempt(1)) and a["state"] == "Failed" and a, timeout_s=120
    )
    second = wait_for(what="attempt 2", check=lambda: attempt(2), timeout_s=60)
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    prefix = f"s3://aerie/warm/{job_id}"
    # A good checkpoint of attempt 1 before the crash: S3's (step 5 or 10: uploads are
    # asynchronous) or, as often with the memory tier's `auto` interval, a newer memory one.
    recorded = {c["uri"].rstrip("/"): c for c in cp.get(f"/v1/jobs/{job_id}/checkpoints")}
    resume_from = str(second["resume_from"]).rstrip("/")
    assert recorded.get(resume_from, {}).get("state") == "good", (second, recorded)
    resume_step = step_of_uri(resume_from)
    assert resume_step is not None and 0 < resume_step < CRASH, second
    s3_good = [
        s
        for s in range(EVERY, CRASH, EVERY)
        if recorded.get(manifest.checkpoint_uri(prefix, s, 1), {}).get("state") == "good"
    ]
    assert resume_step >= min(s3_good, default=0), (second, recorded)  # never older than S3's good
    wait_for(
        what="attempt 2's ranks",
        check=lambda: all(
            len(p := pids(d, "ranks/rank-*.pid")) == 2 and not p & rank_pids[h] for h, d in agents.items()
        ),
        timeout_s=60,
        every_s=0.05,
    )
    restart_s = time.time() - failed["ended_at"]

    def past_resume() -> dict | None:
        a = attempt(2)
        steps = [(n.get("summary") or {}).get("last_step") or 0 for n in (a or {}).get("nodes", [])]
        return a if len(steps) == 2 and min(steps) > resume_step else None

    running = wait_for(what="attempt 2 training past its resume", check=past_resume, timeout_s=90)
    first_step_s = time.time() - failed["ended_at"]
    assert {h: pids(d, "agent.pid") for h, d in agents.items()} == agent_pids
    assert failed["reason"]["kind"] == "exit.nonzero", failed["reason"]
    assert len(running["nodes"]) == 2
    # The new group's rank 0 trained on from the checkpoint (its stream is a fresh one, the
    # failed group's set aside beside it).
    assert min(r["step"] for r in step_records(root)) == resume_step + 1
    assert (root / "algo-1" / "output" / "metrics.attempt-1").is_dir()

    # 2. algo-2 killed whole: a relaunch, from a new attempt directory.
    local_fence.kill_node(root / "algo-2")
    third = wait_for(what="attempt 3", check=lambda: attempt(3), timeout_s=90)
    assert attempt(2)["reason"]["kind"] == "node.lost", attempt(2)["reason"]
    assert third["cause"][CAUSE_MODE] == RestartMode.RELAUNCH, third["cause"]
    job = cp.wait_state("warm", {"Completed", "Failed", "Stopped"}, timeout_s=180)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    relaunched = cp.home / "jobs" / job_id / "attempt-3"
    assert pids(relaunched / "algo-1" / "agent", "agent.pid") - agent_pids["algo-1"]
    described = cp.cli("describe", "warm", check=True).stdout
    assert "in_place" in described and "relaunch" in described, described
    print(
        f"in place, after attempt 1 failed: new worker groups on both nodes {restart_s:.1f}s, "
        f"both past the resumed step {first_step_s:.1f}s"
    )
