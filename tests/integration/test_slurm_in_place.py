"""Issue #22 acceptance 4, on the real one-host Slurm cluster: a rank's crash is recovered in place
inside the job's one allocation. Two nodes x one rank of the stepper; rank 1 exits at step 4 in
attempt 1 -> chaining restarts in place: no new `sbatch` (both attempts' handles name one Slurm
job), the same agent processes (they waited in the allocation), a new worker group, and the job
completes with the Slurm job itself; a stop during the in-place attempt cancels that allocation.
The fallback to a relaunch (a blamed node: a new `sbatch --exclude`) is test_slurm_jobs.py's
`test_a_nan_excludes_nothing_and_a_hang_excludes_its_node_with_exclude`. The last test shows the
in-memory checkpoint tier on Slurm (the stepper takes no snapshots: the tiny trainer does).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from aerie_contracts.checkpoints import CheckpointTier, step_of_uri, tier_of_uri
from aerie_contracts.restarts import CAUSE_MODE, RestartMode
from devtools.harness.jobs import s3_spec
from orchestrator.backends.slurm_cli import find_job_by_name, slurm_job_state
from tests.helpers.attempt_files import attempt_of, job_processes, pids, restored_events, s3_requests_since
from tests.helpers.slurm_plane import slurm_control_plane, stepper_spec
from tests.helpers.wait import wait_for

HOSTS = ("node1", "node2")


@pytest.fixture
def cp(tmp_path, slurm_cluster):
    with slurm_control_plane(tmp_path / "home", slurm_cluster, idle_first=True) as plane:
        yield plane


def _submit(cp, tmp_path: Path, name: str, steps: int) -> None:
    """Two nodes x one rank of the stepper, whose rank 1 exits at step 4 of attempt 1."""
    faults = [{"kind": "exit", "step": 4, "rank": 1, "attempt": 1}]
    health = {"startup_grace_s": 1, "heartbeat_s": 1}
    spec = stepper_spec(tmp_path, name, steps=steps, step_s=0.3, faults=faults, health=health, nodes=2)
    cp.cli("submit", str(spec), check=True)


def _queue() -> str:
    """Slurm's queue and nodes when a wait begins, for the message should the wait time out."""
    queue = subprocess.run(["squeue", "-h", "-o", "%i %j %T %R"], capture_output=True, text=True).stdout
    nodes = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %t"], capture_output=True, text=True).stdout
    return f"queue [{queue.strip()!s:.300}] nodes [{nodes.strip()!s:.200}]"


def test_a_rank_crash_restarts_in_place_inside_one_slurm_allocation(cp, tmp_path):
    _submit(cp, tmp_path, "slurm-warm", steps=10)
    job_id = wait_for(what="the job", check=lambda: cp.job("slurm-warm")["id"], timeout_s=60)
    root = cp.home / "jobs" / job_id / "attempt-1"
    agents = {h: root / h / "agent" for h in HOSTS}
    # Attempt 1's agents, once both run (each Slurm task execs its agent: the pid is the task's).
    agent_pids = wait_for(
        what=f"attempt 1's agents (Slurm: {_queue()})",
        check=lambda: (found := {h: pids(d, "agent.pid") for h, d in agents.items()}) and all(found.values()) and found,
        timeout_s=120,
        every_s=0.2,
    )

    job = cp.wait_state("slurm-warm", {"Completed", "Failed", "Stopped"}, timeout_s=240)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    first, second = job["attempt_list"]
    assert first["state"] == "Failed" and first["reason"]["kind"] == "exit.nonzero", first["reason"]
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    assert sorted(n["host"] for n in second["nodes"]) == list(HOSTS)

    # One allocation: attempt 2's handle is attempt 1's Slurm job; nothing was submitted for it.
    handle_1 = json.loads((root / "handle.json").read_text())
    handle_2 = json.loads((root / "handle-2.json").read_text())
    assert handle_2["slurm_job_id"] == handle_1["slurm_job_id"] and handle_2["attempt_id"] == second["id"]
    assert not (cp.home / "jobs" / job_id / "attempt-2").exists()
    assert find_job_by_name(second["id"]) is None
    # The allocation ends once its agents have exited (each asks the control plane one last time).
    wait_for(
        what="the one Slurm job to end",
        check=lambda: (
            (slurm_job_state(int(handle_1["slurm_job_id"])) or {}).get("state") in {"COMPLETED", "COMPLETING"}
        ),
        timeout_s=30,
        every_s=0.5,
    )

    # The same agents served both attempts (a new one would have written its own pid), each
    # restarting only its worker group, on the in-place attempt's own rendezvous port.
    assert {h: pids(d, "agent.pid") for h, d in agents.items()} == agent_pids
    for host in HOSTS:
        log = (root / host / "logs" / "node.log").read_text()
        assert f"node {host} restarts its worker group in place for {second['id']}" in log, log[-3000:]
        assert (root / host / "output" / "metrics.attempt-1").is_dir()
    assert attempt_of(cp, "slurm-warm", 3) is None
    assert isinstance(handle_2["master_port"], int)
    assert Path(handle_2["root"]) == root


def test_a_stop_during_an_in_place_attempt_cancels_the_allocation(cp, tmp_path):
    """`aerie stop` of attempt 2 (in place) ends the one Slurm job and every process of the job."""
    _submit(cp, tmp_path, "slurm-warm-stop", steps=600)

    def training_in_place() -> dict | None:
        a = attempt_of(cp, "slurm-warm-stop", 2)
        steps = [(n.get("summary") or {}).get("last_step") or 0 for n in (a or {}).get("nodes", [])]
        return a if a and a["state"] == "Running" and len(steps) == 2 and min(steps) > 0 else None

    second = wait_for(what="attempt 2 training in place", check=training_in_place, timeout_s=180, every_s=0.3)
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    job_id = cp.job("slurm-warm-stop")["id"]
    slurm_id = int(json.loads((cp.home / "jobs" / job_id / "attempt-1" / "handle.json").read_text())["slurm_job_id"])
    cp.cli("stop", "slurm-warm-stop", check=True)
    job = cp.wait_state("slurm-warm-stop", {"Stopped", "Failed", "Completed"}, timeout_s=60)
    assert job["state"] == "Stopped" and job["attempt_list"][1]["state"] == "Stopped", json.dumps(job)[:3000]
    wait_for(
        what="the Slurm job cancelled and its processes gone",
        check=lambda: (slurm_job_state(slurm_id) or {}).get("state") == "CANCELLED" and not job_processes(job_id),
        timeout_s=30,
        every_s=0.5,
    )


@pytest.mark.slow
def test_an_in_place_slurm_attempt_resumes_from_the_memory_tier(tmp_path, slurm_cluster):
    """Issue #22's memory tier on Slurm: 2 nodes x 1 rank of the tiny trainer, memory checkpoints
    every 4 steps (each node's agent replicates to the other on the endpoint it derives from the job
    id), S3's every 20 (none before the fault); rank 1 exits at step 11, three steps after the last
    snapshot (the ranks may outrun the replication: each failed node replicates and reports its
    newest snapshot before its failure, `end_group(flush=True)`) -> attempt 2 in place in the same
    allocation resumes from the memory checkpoint of step 8, and no request reaches the S3 server while it
    restores."""
    with slurm_control_plane(tmp_path / "home", slurm_cluster, s3=True, idle_first=True) as cp:
        path = s3_spec(
            tmp_path,
            "slurm-mem",
            steps=14,
            s3_every=20,
            memory_every=4,
            procs=1,
            max_restarts=2,
            faults=[{"kind": "exit", "step": 11, "rank": 1, "attempt": 1}],
        )
        spec = json.loads(path.read_text())
        # On a loaded host the peer's hang verdict may come first and blame the exiting rank's node:
        # kept (in place) all the same, as test_memory_tier.py keeps it.
        spec["retry"]["exclude_after_blames"] = 3
        path.write_text(json.dumps({**spec, "backend": "slurm"}))
        cp.cli("submit", str(path), check=True)
        job_id = wait_for(what="the job", check=lambda: cp.job("slurm-mem")["id"], timeout_s=60)
        root = cp.home / "jobs" / job_id / "attempt-1"
        s3_log = cp.home / "devstack" / "s3.log"
        wait_for(
            what="attempt 1 failed",
            check=lambda: (a := attempt_of(cp, "slurm-mem", 1)) and a["state"] == "Failed",
            timeout_s=300,
        )
        second = wait_for(what="attempt 2", check=lambda: attempt_of(cp, "slurm-mem", 2), timeout_s=60)
        mark = s3_log.stat().st_size  # chaining's S3 listing is done: what follows is the restore
        assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
        assert tier_of_uri(second["resume_from"]) == CheckpointTier.MEMORY, second
        # The newest memory checkpoint good at the decision: step 8, or 4 while 8's replica was
        # still on its way when rank 1 exited at step 11 (a loaded host).
        assert step_of_uri(second["resume_from"]) in (4, 8), second
        restored = wait_for(
            what="attempt 2's ranks restored",
            check=lambda: len(r := restored_events(root, "node*")) == 2 and r,
            timeout_s=120,
        )
        during = s3_requests_since(s3_log, mark, ignore_attempt=2)  # its next save may have begun
        assert during == [], f"S3 requests while the ranks restored from memory: {during}"
        assert {r["uri"] for r in restored} == {second["resume_from"]}, restored
        job = cp.wait_state("slurm-mem", {"Completed", "Failed", "Stopped"}, timeout_s=240)
        assert job["state"] == "Completed", json.dumps(job)[:3000]
        assert len(job["attempt_list"]) == 2
        # One allocation, and its nodes' replication endpoints in the handle (for a spare's hand-over).
        handle_1 = json.loads((root / "handle.json").read_text())
        handle_2 = json.loads((root / "handle-2.json").read_text())
        assert handle_2["slurm_job_id"] == handle_1["slurm_job_id"]
        assert sorted(handle_2["memory_peers"]) == list(HOSTS)
