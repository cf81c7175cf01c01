"""Issue #23 acceptance 1: a hot spare takes a lost node's place, in place.

A 2-node x 2-rank job of the tiny trainer on the local backend with `resources.spare_nodes: 1`:
algo-1 and algo-2 train, algo-3's agent waits without ranks. The spare dies first (its tree
SIGKILLed): the backend's poll starts algo-4 in its place (`Aerie Spare Replaced`). Once attempt
1's memory checkpoint of step 10 (or newer) is good, algo-2's whole tree (agent and ranks) is killed with
SIGKILL and its shared-memory folder removed (the machine is gone) -> `node.lost`, algo-2 blamed
and excluded -> attempt 2 runs **in place** on algo-1 and algo-4 (algo-4 in algo-2's rank slot):
algo-1's agent is the same process, algo-4's agent is the spare's, already running; algo-4
restores ranks 2-3 from the replicas algo-1 holds, and the backend starts a new spare (algo-5) in
the background. The job
completes, and the unused spare ends. The time from the node's death to the first step after
is printed (bench/chaos.py carries the figure).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from aerie_contracts import env as aerie_env
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.events import DetailType
from aerie_contracts.restarts import CAUSE_MODE, CAUSE_REPLACED_NODES, RestartMode
from devtools.harness.jobs import attempt_step_records, s3_spec
from orchestrator.backends import local_fence
from tests.helpers.attempt_files import attempt_of, good_memory, pids, restored_events
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

STEPS, S3_EVERY, MEM_EVERY = 40, 10, 10


def test_a_hot_spare_takes_a_lost_node_s_slot_in_place_and_restores_its_shards(s3_plane, tmp_path):
    cp = s3_plane
    path = s3_spec(
        tmp_path,
        "spare",
        steps=STEPS,
        s3_every=S3_EVERY,
        memory_every=MEM_EVERY,
        max_restarts=3,
        spare_nodes=1,
        backend_options={"node_slots": 5},  # a slot for the dead spare's replacement and one for the swap's
    )
    job_id = cp.submit(path, "spare")
    root = cp.home / "jobs" / job_id / "attempt-1"
    area = Path(cp.env[aerie_env.MEMORY_CHECKPOINT_DIR])

    first = wait_for(what="attempt 1 with its spare", check=lambda: attempt_of(cp, "spare", 1), timeout_s=60)
    wait_for(what="the spare's agent", check=lambda: pids(root / "algo-3" / "agent", "agent.pid"))
    # A spare that dies while it waits is replaced: the backend's poll sees its tree gone and
    # starts algo-4 in its place (an event says so); algo-4 is the spare from here on.
    local_fence.kill_node(root / "algo-3")
    replaced = wait_for(
        what="the dead spare's replacement",
        check=lambda: [e["detail"] for e in cp.events("spare") if e["detail-type"] == DetailType.SPARE_REPLACED],
        timeout_s=60,
    )
    assert [(d["host"], d["replacement"], d["attempt"]) for d in replaced] == [("algo-3", "algo-4", 1)], replaced
    spare_agent = wait_for(what="the new spare's agent", check=lambda: pids(root / "algo-4" / "agent", "agent.pid"))
    wait_for(what="the new spare waiting", check=lambda: "is a hot spare" in _log(root / "algo-4"), timeout_s=90)
    survivor_agent = wait_for(what="algo-1's agent", check=lambda: pids(root / "algo-1" / "agent", "agent.pid"))
    wait_for(what="first memory checkpoint", check=lambda: good_memory(cp, job_id, MEM_EVERY, 1), timeout_s=180)
    first = attempt_of(cp, "spare", 1)
    assert first["spares"] == ["algo-4"], first
    assert sorted(n["host"] for n in first["nodes"]) == ["algo-1", "algo-2"]  # the spare has no ranks
    assert not list((root / "algo-4" / "agent" / "ranks").glob("rank-*.pid"))

    died_at = time.time()
    local_fence.kill_node(root / "algo-2")
    shutil.rmtree(area / "algo-2")
    second = wait_for(what="attempt 2", check=lambda: attempt_of(cp, "spare", 2), timeout_s=120)
    assert attempt_of(cp, "spare", 1)["reason"]["kind"] == "node.lost", attempt_of(cp, "spare", 1)["reason"]
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    assert second["cause"][CAUSE_REPLACED_NODES] == {"algo-2": "algo-4"}, second["cause"]
    assert second["resume_from"].startswith(f"mem://{job_id}/"), second
    restored = wait_for(
        what="attempt 2 restored", check=lambda: len(r := restored_events(root)) == 4 and r, timeout_s=120
    )
    assert {r["uri"] for r in restored} == {second["resume_from"]}, restored
    switched = root / "algo-1" / "output" / "metrics.attempt-1"  # until then "metrics" is attempt 1's
    first_step = wait_for(
        what="attempt 2's first step",
        check=lambda: switched.exists() and attempt_step_records(cp.home / "jobs" / job_id, 2),
        timeout_s=120,
    )[0]
    # The newest good snapshot when the node died: step 10, or 20 where a loaded host let attempt 1
    # take the next one before the kill landed (the wait above asks for 10 or newer).
    resumed = step_of_uri(second["resume_from"])
    assert resumed is not None and resumed >= MEM_EVERY and resumed % MEM_EVERY == 0, second["resume_from"]
    assert first_step["step"] == resumed + 1, (first_step, second["resume_from"])
    print(f"\nnode death -> first step after: {first_step['t'] - died_at:.1f}s (attempt 2, step {first_step['step']})")
    # In place: no attempt-2 directory; the survivor's and the spare's agents are the same processes.
    assert not (root.parent / "attempt-2").exists()
    assert pids(root / "algo-4" / "agent", "agent.pid") == spare_agent
    assert pids(root / "algo-1" / "agent", "agent.pid") == survivor_agent
    spare_log = (root / "algo-4" / "logs" / "node.log").read_text()
    for rank in (2, 3):
        assert f"rank {rank}: restoring from the replica copy" in spare_log, spare_log[-3000:]

    # The pool is replenished: a new spare tree (algo-5) waits beside attempt 2.
    assert attempt_of(cp, "spare", 2)["spares"] == ["algo-5"], attempt_of(cp, "spare", 2)
    wait_for(
        what="the new spare waiting",
        check=lambda: "is a hot spare" in _log(root / "algo-5"),
        timeout_s=60,
    )

    job = cp.wait_state("spare", {"Completed", "Failed", "Stopped"}, timeout_s=240)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    assert sorted(n["host"] for n in attempt_of(cp, "spare", 2)["nodes"]) == ["algo-1", "algo-4"]
    describe = cp.cli("describe", "spare", check=True).stdout
    assert "SPARES" in describe and "algo-4" in describe, describe
    # The record of which node was a spare: attempt 1's Running event names it, attempt 2's the swap.
    running = [
        e["detail"]
        for e in cp.events("spare")
        if e["detail-type"] == DetailType.ATTEMPT_STATE_CHANGE and e["detail"]["state"] == "Running"
    ]
    assert [(d["attempt"], d["hosts"], d.get("spares"), d.get("replaced_nodes")) for d in running] == [
        (1, ["algo-1", "algo-2"], ["algo-3"], None),
        (2, ["algo-1", "algo-4"], ["algo-5"], {"algo-2": "algo-4"}),
    ], running
    wait_for(what="the unused spare's exit", check=lambda: "not needed" in _log(root / "algo-5"), timeout_s=30)


def _log(node: Path) -> str:
    try:
        return (node / "logs" / "node.log").read_text()
    except OSError:
        return ""


def test_a_node_that_fails_preflight_is_replaced_by_a_spare_in_place(s3_plane, tmp_path):
    """A hot spare for a node whose pre-flight fails (a full /dev/shm injected on algo-2): no rank
    starts in attempt 1; attempt 2 runs in place on algo-1 and the spare algo-3, whose own
    pre-flight (alone, while it waited, then with its new peer) passed, and completes."""
    from aerie_contracts import FailureKind
    from aerie_contracts import env as E
    from tests.helpers.contract_jobs import contract_spec

    cp = s3_plane
    preflight = {"enabled": True, "burn_s": 0.5, "collective_mb": 2, "min_link_gbps": 0.05, "budget_s": 60}
    path = Path(
        contract_spec(
            tmp_path,
            "pf-spare",
            ["--steps", "2"],
            procs=1,
            checkpoint={"s3_uri": "s3://aerie/pf-spare"},
            health={"preflight": preflight},
            retry={"max_restarts": 2},
            env={E.PREFLIGHT_FAULT.name: "shm_full@algo-2"},
        )
    )
    spec = json.loads(path.read_text())
    spec["resources"]["spare_nodes"] = 1
    path.write_text(json.dumps(spec))
    cp.cli("submit", str(path), check=True)
    job = cp.wait_state("pf-spare", {"Completed", "Failed", "Stopped"}, timeout_s=300)
    assert job["state"] == "Completed", json.dumps(job)[:3000]
    first, second = job["attempt_list"][:2]
    assert len(job["attempt_list"]) == 2, job["attempt_list"]
    assert first["reason"]["kind"] == FailureKind.PREFLIGHT_FAILED and first["reason"]["host"] == "algo-2"
    assert second["cause"][CAUSE_MODE] == RestartMode.IN_PLACE, second["cause"]
    assert second["cause"][CAUSE_REPLACED_NODES] == {"algo-2": "algo-3"}, second["cause"]
    assert sorted(n["host"] for n in second["nodes"]) == ["algo-1", "algo-3"], second["nodes"]
    assert all(n["preflight"]["passed"] for n in second["nodes"]), second["nodes"]
    root = cp.home / "jobs" / job["id"] / "attempt-1"
    assert not (root.parent / "attempt-2").exists()  # in place
    alone = json.loads((root / "algo-3" / "agent" / "preflight.json").read_text())
    assert alone["passed"], alone  # the last result: with algo-1, in attempt 2
    # Its own result as a spare, alone, while it waited: shown with attempt 1 (no node of it).
    assert first["spare_preflight"]["algo-3"]["passed"] and first["spare_preflight"]["algo-3"]["spare"], first
    described = cp.cli("describe", "pf-spare", check=True).stdout
    assert "(spare)" in described, described
