"""The slurm backend's in-place attempts (issue #22) without a cluster: the handle an in-place
attempt gets (the allocation's, no `sbatch`), its rendezvous port, and node states per attempt.
The whole job on the real one-host cluster: tests/integration/test_slurm_in_place.py."""

from __future__ import annotations

from pathlib import Path

from aerie_contracts import env as aerie_env
from aerie_contracts.container import write_json
from aerie_contracts.env import SLURM_PORT_BASE, SLURM_PORT_SPAN
from aerie_contracts.states import AttemptState
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.slurm import SlurmBackend, in_place_port
from orchestrator.backends.slurm_nodes import node_status
from orchestrator.backends.slurm_script import SlurmOptions, launch_document
from tests.helpers.launch_requests import launch_request


def _request(number: int, retry: dict | None = None, in_place_of: dict | None = None) -> LaunchRequest:
    spec = {"name": "warm", "resources": {"instance_count": 2}, "backend": "slurm"}
    return launch_request(number, spec, retry, in_place_of=in_place_of)


def _allocation(tmp_path: Path, job_id: int = 4242) -> dict:
    """Attempt 1's directory as a started Slurm job leaves it: its handle, launch.json, hosts.json."""
    root = tmp_path / "jobs" / "warm-abc" / "attempt-1"
    root.mkdir(parents=True)
    write_json(root / "launch.json", {"root": str(root), "master_port": None})
    write_json(root / "hosts.json", {"hosts": ["node1", "node2"], "slurm_job_id": job_id})
    handle = {"root": str(root), "hosts": [], "slurm_job_id": job_id, "job_name": "warm-abc-a1", "nodes": 2}
    write_json(root / "handle.json", handle)
    return handle


def test_an_in_place_attempt_reuses_the_allocation_on_a_port_of_its_own(tmp_path):
    backend = SlurmBackend(tmp_path / "jobs")
    first = _allocation(tmp_path)
    second = backend.start(_request(2, in_place_of=first))
    assert second["slurm_job_id"] == 4242 and second["root"] == first["root"]
    assert second["hosts"] == ["node1", "node2"]  # GET .../next hands the attempt to these hosts only
    assert second["attempt_id"] == "warm-abc-a2" and second["in_place"] is True
    derived = SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN  # the allocation's port (agent.identity)
    assert second["master_port"] == in_place_port(Path(first["root"]), 4242, 1) != derived
    assert SLURM_PORT_BASE <= second["master_port"] < SLURM_PORT_BASE + SLURM_PORT_SPAN
    # Nothing was submitted: no attempt-2 directory, no script.
    assert not (tmp_path / "jobs" / "warm-abc" / "attempt-2").exists()
    # Idempotent (a re-adopted launch keeps its port); a further in-place attempt moves on.
    assert backend.start(_request(2, in_place_of=first)) == second
    third = backend.start(_request(3, in_place_of=second))
    assert third["slurm_job_id"] == 4242 and third["master_port"] not in (derived, second["master_port"])


def test_agents_wait_for_an_in_place_successor_only_where_one_may_come(tmp_path):
    def wait_of(retry: dict) -> str | None:
        document = launch_document(_request(1, retry), tmp_path, tmp_path, SlurmOptions(), in_place_wait_s=120.0)
        return document["env"]["attempt"].get(aerie_env.IN_PLACE_WAIT_S)

    assert wait_of({"max_restarts": 2}) == "120.0"
    assert wait_of({"max_restarts": 0}) is None
    assert wait_of({"max_restarts": 2, "in_place_restarts": 0}) is None


def test_a_node_reports_the_outcome_of_its_own_attempt_only(tmp_path):
    ml_root = tmp_path / "node1"
    (ml_root / "agent").mkdir(parents=True)
    write_json(ml_root / "agent" / "agent.pid", 123)
    write_json(ml_root / "agent" / "exit.json", {"exit_code": 1, "attempt": "a1", "reason": {"kind": "loss.nan"}})
    # Attempt 1 failed; its in-place successor runs in the same, still running, allocation.
    assert node_status(ml_root, "node1", False, False, "RUNNING", "a1").state == AttemptState.FAILED
    assert node_status(ml_root, "node1", False, False, "RUNNING", "a2").state == AttemptState.RUNNING
    # The allocation ended without an outcome of attempt 2: its node is lost, not failed by attempt 1's cause.
    lost = node_status(ml_root, "node1", True, False, "FAILED", "a2")
    assert lost.state == AttemptState.FAILED and lost.reason["kind"] == "node.lost"
