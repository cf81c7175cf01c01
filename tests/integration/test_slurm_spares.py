"""Issue #23 acceptance 4, on the real one-host Slurm cluster: a blamed node is replaced by a hot
spare within the same allocation. One node x one rank of the stepper with `resources.spare_nodes:
1`: the one `sbatch` asks for two nodes, node1 runs the attempt and node2 waits as its spare. The
rank hangs at step 3 of attempt 1 (silent.hang on the only node: node1 blamed and excluded) ->
chaining restarts in place with node2 in node1's rank slot: no new attempt `sbatch` (both
attempts' handles name one Slurm job), the spare's agent is the one that waited, and the job
completes. The pool is replenished: attempt 2 submits a spare allocation of one node, which can
only be node3 (node1 and node2 are excluded), whose agent waits as attempt 2's spare and ends with
the job; no Slurm job of the run is left.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES, RestartMode
from orchestrator.backends.slurm_cli import TERMINAL, find_job_by_name, slurm_job_state
from tests.helpers.attempt_files import pids
from tests.helpers.slurm_plane import slurm_control_plane, stepper_spec
from tests.helpers.wait import wait_for


@pytest.fixture
def cp(tmp_path, slurm_cluster):
    with slurm_control_plane(tmp_path / "home", slurm_cluster, idle_first=True) as plane:
        yield plane


def test_a_blamed_node_is_replaced_by_a_spare_inside_one_slurm_allocation(cp, tmp_path):
    spec = stepper_spec(
        tmp_path,
        "slurm-spare",
        # Long enough after the hang for attempt 2's spare allocation to start and be learned.
        steps=60,
        step_s=0.25,
        spare_nodes=1,
        faults=[{"kind": "busy_hang", "step": 3, "attempt": 1}],
        # A hang floor above a loaded host's exit of a torch-warm interpreter after its last step.
        health={"startup_grace_s": 1, "hang_floor_s": 8, "heartbeat_s": 1},
    )
    cp.cli("submit", str(spec), check=True)
    job_id = wait_for(what="the job", check=lambda: cp.job("slurm-spare")["id"], timeout_s=60)
    root = cp.home / "jobs" / job_id / "attempt-1"
    # The spare's agent, waiting in the allocation (each Slurm task execs its agent).
    spare_agent = wait_for(
        what="the spare's agent", check=lambda: pids(root / "node2" / "agent", "agent.pid"), timeout_s=120, every_s=0.2
    )

    # The replenished spare: attempt 2's spare allocation on node3, its agent waiting as a spare.
    replenished = wait_for(
        what="the replenished spare's agent",
        check=lambda: pids(root / "node3" / "agent", "agent.pid"),
        timeout_s=120,
        every_s=0.2,
    )
    running = wait_for(
        what="attempt 2's handle to name node3 as its spare",
        check=lambda: (a := cp.job("slurm-spare")["attempt_list"])[-1]["spares"] == ["node3"] and a[-1],
        timeout_s=60,
        every_s=0.5,
    )
    assert running["number"] == 2, running

    job = cp.wait_state("slurm-spare", {"Completed", "Failed", "Stopped"}, timeout_s=180)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    assert len(job["attempt_list"]) == 2, json.dumps(job["attempt_list"])[:3000]
    first, second = job["attempt_list"]
    assert first["reason"]["kind"] == "silent.hang", first["reason"]
    assert [n["host"] for n in first["nodes"]] == ["node1"] and first["spares"] == ["node2"], first
    assert [(b["host"], b["rule"]) for b in job["blames"]] == [("node1", "only_node")]
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    assert second["cause"][CAUSE_REPLACED_NODES] == {"node1": "node2"}, second["cause"]
    assert [n["host"] for n in second["nodes"]] == ["node2"] and second["spares"] == ["node3"]

    # One allocation of two nodes: attempt 2's handle is attempt 1's Slurm job; nothing was submitted.
    assert "#SBATCH --nodes=2\n" in (root / "job.sbatch").read_text()
    handle_1 = json.loads((root / "handle.json").read_text())
    handle_2 = json.loads((root / "handle-2.json").read_text())
    assert handle_2["slurm_job_id"] == handle_1["slurm_job_id"] and handle_2["attempt_id"] == second["id"]
    assert handle_2["hosts"] == ["node2"] and handle_2["replaced_nodes"] == {"node1": "node2"}
    assert not (cp.home / "jobs" / job_id / "attempt-2").exists()
    assert find_job_by_name(second["id"]) is None

    # The spare allocation: one node for the one spare used, every node the job used excluded.
    spare_script = (root / "spares-2" / "job.sbatch").read_text()
    assert f"#SBATCH --job-name={second['id']}-spares\n" in spare_script and "#SBATCH --nodes=1\n" in spare_script
    assert "#SBATCH --exclude=node1,node2\n" in spare_script
    [allocation] = handle_2["spare_allocations"]
    assert allocation["slurm_job_id"] == find_job_by_name(f"{second['id']}-spares")
    assert allocation["slurm_job_id"] != handle_1["slurm_job_id"]
    spare_log = (root / "node3" / "logs" / "node.log").read_text()
    assert "node3 is a hot spare" in spare_log, spare_log[-3000:]
    assert pids(root / "node3" / "agent", "agent.pid") == replenished

    # The spare that waited took the slot: the same agent, which ran no ranks in attempt 1.
    assert pids(root / "node2" / "agent", "agent.pid") == spare_agent
    log = (root / "node2" / "logs" / "node.log").read_text()
    assert f"hot spare node2 takes a rank slot in {second['id']}" in log, log[-3000:]
    # The allocations end with their agents (node1's left when it was replaced, node2's at the
    # end, node3's when GET .../next said the job is over): no Slurm job of this run is left.
    for slurm_id in (handle_1["slurm_job_id"], allocation["slurm_job_id"]):
        wait_for(
            what=f"Slurm job {slurm_id} to end",
            check=lambda i=slurm_id: (slurm_job_state(int(i)) or {}).get("state") in TERMINAL | {"COMPLETING"},
            timeout_s=60,
            every_s=0.5,
        )
    names = f"{first['id']},{second['id']}-spares"
    wait_for(
        what="squeue to list none of the run's jobs",
        check=lambda: (
            not subprocess.run(
                ["squeue", "-h", f"--name={names}", "-o", "%i"], capture_output=True, text=True, check=True
            ).stdout.strip()
        ),
        timeout_s=60,
        every_s=0.5,
    )
