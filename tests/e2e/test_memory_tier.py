"""Issue #22 acceptance 1 (and 3, end to end): recovery in place from in-memory checkpoints.

One 2-node x 2-rank job of the tiny trainer on the local backend, the loopback S3 server as the
durable tier (every 10 steps) and memory checkpoints every 4 steps (each node's ranks snapshot into
its shared-memory folder; its agent replicates them to the other node and reports them; the
control plane records one good once both copies of every rank exist):

1. a busy hang of rank 1 (algo-1) at step 15 -> `silent.hang` -> attempt 2 **in place** from the
   memory checkpoint of step 12 (at most 4 steps old; S3's newest is step 10): the same agent
   processes, new rank processes, and not one request reaches the S3 server while the ranks
   restore;
2. in attempt 2, rank 3 (algo-2) stops at step 23 (SIGSTOP). While the hang is being detected the
   test flips a byte in algo-2's own copy of rank 2's step-20 snapshot: attempt 3 resumes in place
   from step 20 all the same — algo-2's agent finds the checksum wrong and fetches the replica
   algo-1 holds;
3. the job completes, and every step's loss of the three attempts equals, bit for bit, the loss of
   the same step in an uninterrupted run of the same job (run after it in the same control plane).

`retry.exclude_after_blames: 3`: a busy hang blames the spinning node, and by default a first
blame excludes it (a relaunch); here the node is kept, as an operator would for a software hang.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aerie_checkpoint import manifest
from aerie_contracts import memckpt
from aerie_contracts.checkpoints import memory_uri
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_RESUME_FALLBACK, RestartMode
from devtools.harness.jobs import attempt_step_records, s3_spec
from tests.helpers.attempt_files import attempt_of, good_memory, pids, restored_events, running_pids, s3_requests_since
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

STEPS, S3_EVERY, MEM_EVERY, HANG, STOP = 32, 10, 4, 15, 23


def _spec(tmp: Path, name: str, faults: list[dict] | None) -> Path:
    path = s3_spec(tmp, name, steps=STEPS, s3_every=S3_EVERY, memory_every=MEM_EVERY, max_restarts=3, faults=faults)
    spec = json.loads(path.read_text())
    spec["retry"]["exclude_after_blames"] = 3
    path.write_text(json.dumps(spec))
    return path


def _losses(job_dir: Path, number: int) -> dict[int, float]:
    """Rank 0's loss per step in attempt `number`."""
    return {int(r["step"]): r["loss"] for r in attempt_step_records(job_dir, number)}


def test_hang_recovers_in_place_from_memory_and_a_corrupt_copy_is_replaced_by_the_replica(s3_plane, tmp_path):
    cp = s3_plane
    s3_log = cp.home / "devstack" / "s3.log"
    faults = [
        {"kind": "busy_hang", "step": HANG, "rank": 1, "attempt": 1},
        {"kind": "sigstop", "step": STOP, "rank": 3, "attempt": 2},
    ]
    job_id = cp.submit(_spec(tmp_path, "mem", faults), "mem")
    job_dir = cp.home / "jobs" / job_id
    root = job_dir / "attempt-1"
    agents = {h: root / h / "agent" for h in ("algo-1", "algo-2")}
    area = Path(cp.env["AERIE_MEMORY_CHECKPOINT_DIR"])

    def attempt(n: int) -> dict | None:
        return attempt_of(cp, "mem", n)

    agent_pids, rank_pids = running_pids(agents, 2)

    # 1. The busy hang: attempt 2 in place, from memory, reading nothing from S3.
    wait_for(what="attempt 1 failed", check=lambda: (a := attempt(1)) and a["state"] == "Failed", timeout_s=120)
    second = wait_for(what="attempt 2", check=lambda: attempt(2), timeout_s=60)
    mark = s3_log.stat().st_size  # chaining's S3 listing is done: what follows is the restore
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    assert second["resume_from"] == memory_uri(job_id, 12, 1), second
    assert second["cause"][CAUSE_RESUME_FALLBACK] == manifest.checkpoint_uri(f"s3://aerie/mem/{job_id}", 10, 1)
    restored = wait_for(
        what="attempt 2's ranks restored",
        check=lambda: len(r := restored_events(root)) == 4 and r,
        timeout_s=90,
    )
    during = s3_requests_since(s3_log, mark)
    assert during == [], f"S3 requests while the ranks restored from memory: {during}"
    assert {r["uri"] for r in restored} == {second["resume_from"]}, restored
    assert {h: pids(d, "agent.pid") for h, d in agents.items()} == agent_pids
    assert all(not pids(d, "ranks/rank-*.pid") & rank_pids[h] for h, d in agents.items())

    # 2. Rank 3 stops at step 23; rank 2's own copy of step 20 gets a flipped byte.
    wait_for(
        what="attempt 2's memory checkpoint of step 20", check=lambda: good_memory(cp, job_id, 20, 2), timeout_s=90
    )
    snapshot = memckpt.local_dir(area / "algo-2", job_id) / memckpt.file_name(20, 2)
    with open(snapshot, "r+b") as f:
        f.seek(memckpt.HEADER_SIZE + 100)
        byte = f.read(1)
        f.seek(memckpt.HEADER_SIZE + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    # The heartbeat's answer reached algo-2's agent: step 20, good, is what no pruning may drop.
    keep = memckpt.local_dir(area / "algo-2", job_id)
    wait_for(what="algo-2 protects step 20", check=lambda: memckpt.read_keep(keep) == 20, timeout_s=30)
    third = wait_for(what="attempt 3", check=lambda: attempt(3), timeout_s=90)
    assert third["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, third["cause"]
    assert third["resume_from"] == memory_uri(job_id, 20, 2), third

    job = cp.wait_state("mem", {"Completed", "Failed", "Stopped"}, timeout_s=180)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    assert {r["uri"] for r in restored_events(root)} == {third["resume_from"]}
    node_log = (root / "algo-2" / "logs" / "node.log").read_text()
    assert "step 20, rank 2: restoring from the replica copy" in node_log, node_log[-3000:]
    assert "step 20, rank 3: restoring from the local copy" in node_log

    # 3. Bit for bit against an uninterrupted run: every step any attempt trained (steps
    # after a resume point were trained twice) gave the uninterrupted run's loss.
    cp.cli("submit", str(_spec(tmp_path, "ref", None)), check=True)
    ref = cp.wait_state("ref", {"Completed", "Failed", "Stopped"}, timeout_s=180)
    assert ref["state"] == "Completed", json.dumps(ref)[:3000]
    reference = _losses(cp.home / "jobs" / ref["id"], 1)
    assert sorted(reference) == list(range(1, STEPS + 1))
    trained = {n: _losses(job_dir, n) for n in (1, 2, 3)}
    differ = {n: {s: (x, reference[s]) for s, x in t.items() if x != reference[s]} for n, t in trained.items()}
    assert differ == {1: {}, 2: {}, 3: {}}, differ
    assert set().union(*trained.values()) == set(reference)
    # The job's memory folders are gone once it completed.
    assert not list(area.glob(f"*/{job_id}"))
