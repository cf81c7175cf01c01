"""Issue #22 acceptance 2: a lost node's ranks come back from the replica its peer holds.

One 2-node x 2-rank job of the tiny trainer on the local backend (a pool of 4 node slots), S3 every
20 steps, memory checkpoints every 4 (S3's steps are memory's too, so no S3 checkpoint is ever
newer than the newest memory one: with S3 every 10, a loaded host let attempt 2 commit S3's step
30 before algo-3's kill landed, and attempt 3 rightly resumed from it instead of memory's 28).

The local backend's nodes are folders of one host, so "the machine is gone" is played by killing
the node's processes (agent and ranks, SIGKILL) *and* removing its shared-memory folder:

1. attempt 1, once its memory checkpoint of step 12 is good: algo-2 is lost -> `node.lost`, algo-2
   blamed and excluded -> a **relaunch** on algo-1 and algo-3 from that memory checkpoint. algo-1
   restores ranks 0-1 from its own copies; algo-3, the replacement, fetches ranks 2-3 from the
   replicas algo-1 holds. Not one read reaches the S3 server while the ranks restore (a write
   attempt 1 had under way may still land, or be marked BAD, then: it is no request of the restore's).
2. attempt 2, once its memory checkpoint of step 24 is good: algo-3 is lost, and the replicas of its
   ranks on algo-1 are removed too (both copies gone) -> a relaunch on algo-1 and algo-4 names the
   memory checkpoint again, algo-4 finds neither copy, and every rank resumes from S3's checkpoint
   instead (the fallback the control plane handed out with it), reading it from S3.
3. the job completes; a step trained twice (before a failure and after the resume) gave the same
   loss both times.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aerie_contracts import memckpt
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_RESUME_FALLBACK, RestartMode
from devtools.harness.jobs import attempt_step_records, s3_spec
from orchestrator.backends import local_fence
from tests.helpers.attempt_files import (
    attempt_of,
    good_memory,
    good_s3,
    restored_events,
    s3_reads_since,
    s3_requests_since,
    s3_restore_reads_since,
)
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

STEPS, S3_EVERY, MEM_EVERY = 40, 20, 4


def test_a_lost_node_is_replaced_from_its_peers_replica_and_from_s3_when_both_copies_are_gone(s3_plane, tmp_path):
    cp = s3_plane
    s3_log = cp.home / "devstack" / "s3.log"
    spec = s3_spec(
        tmp_path,
        "lost",
        steps=STEPS,
        s3_every=S3_EVERY,
        memory_every=MEM_EVERY,
        max_restarts=3,
        backend_options={"node_slots": 4},
    )
    job_id = cp.submit(spec, "lost")
    job_dir = cp.home / "jobs" / job_id
    area = Path(cp.env["AERIE_MEMORY_CHECKPOINT_DIR"])
    prefix = f"s3://aerie/lost/{job_id}"

    def attempt(n: int) -> dict | None:
        return attempt_of(cp, "lost", n)

    # 1. algo-2 lost once step 12 is in memory: the replacement restores from algo-1's replicas.
    wait_for(what="memory checkpoint of step 12", check=lambda: good_memory(cp, job_id, 12, 1), timeout_s=180)
    local_fence.kill_node(job_dir / "attempt-1" / "algo-2")
    shutil.rmtree(area / "algo-2")
    second = wait_for(what="attempt 2", check=lambda: attempt(2), timeout_s=120)
    mark = s3_log.stat().st_size  # chaining's S3 listing is done: what follows is the restore
    assert attempt(1)["reason"]["kind"] == "node.lost", attempt(1)["reason"]
    assert second["cause"][CAUSE_MODE] == RestartMode.RELAUNCH, second["cause"]
    assert second["resume_from"].startswith(f"mem://{job_id}/"), second
    root2 = job_dir / "attempt-2"
    restored = wait_for(
        what="attempt 2 restored", check=lambda: len(r := restored_events(root2)) == 4 and r, timeout_s=120
    )
    assert {r["uri"] for r in restored} == {second["resume_from"]}, restored
    # No read of attempt 1's checkpoint objects from S3: the ranks restored from memory. (A write
    # may still land: algo-2's last upload, or algo-1's, marked BAD when its collective broke.)
    assert s3_restore_reads_since(s3_log, mark, 2) == [], s3_reads_since(s3_log, mark)
    assert sorted(p.name for p in root2.iterdir() if p.name.startswith("algo-")) == ["algo-1", "algo-3"]
    new_node = (root2 / "algo-3" / "logs" / "node.log").read_text()
    kept_node = (root2 / "algo-1" / "logs" / "node.log").read_text()
    for rank in (2, 3):
        assert f"rank {rank}: restoring from the replica copy" in new_node, new_node[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: restoring from the local copy" in kept_node, kept_node[-3000:]

    # 2. algo-3 lost with both copies of its ranks: every rank takes S3's checkpoint instead (the
    # one of step 20, once committed: its upload may still run a few steps after it was taken).
    wait_for(
        what="attempt 2's memory checkpoint of step 24", check=lambda: good_memory(cp, job_id, 24, 2), timeout_s=180
    )
    wait_for(what="an S3 checkpoint of step 20", check=lambda: good_s3(cp, job_id, 20), timeout_s=120)
    local_fence.kill_node(root2 / "algo-3")
    shutil.rmtree(area / "algo-3")
    shutil.rmtree(memckpt.replica_dir(area / "algo-1", job_id, "algo-3"))
    third = wait_for(what="attempt 3", check=lambda: attempt(3), timeout_s=120)
    mark = s3_log.stat().st_size
    assert third["resume_from"].startswith(f"mem://{job_id}/"), third
    fallback = third["cause"][CAUSE_RESUME_FALLBACK]
    assert fallback and fallback.startswith(prefix), third["cause"]
    root3 = job_dir / "attempt-3"
    restored = wait_for(
        what="attempt 3 restored", check=lambda: len(r := restored_events(root3)) == 4 and r, timeout_s=120
    )
    assert {r["uri"] for r in restored} == {fallback}, restored
    seen = s3_requests_since(s3_log, mark)
    reads = [r for r in seen if r.startswith('"GET /aerie/lost/') or "GET /aerie/lost/" in r]
    assert reads, f"the fallback was read from S3: {seen}"

    job = cp.wait_state("lost", {"Completed", "Failed", "Stopped"}, timeout_s=240)
    assert job["state"] == "Completed", json.dumps(job)[:3000]

    # 3. Deterministic replay: the steps trained twice gave the same loss.
    losses: dict[int, float] = {}
    for number in (1, 2, 3):
        for rec in attempt_step_records(job_dir, number):
            step, loss = int(rec["step"]), rec["loss"]
            assert losses.setdefault(step, loss) == loss, (number, step, losses[step], loss)
    assert sorted(losses) == list(range(1, STEPS + 1))
