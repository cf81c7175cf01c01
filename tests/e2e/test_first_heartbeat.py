"""A node whose agent never starts is lost after `health.first_heartbeat_s`, and the job restarts.

A real `aerie up` (controller, in-process chain_restart) and a real 2-node job on the local
backend. In attempt 1, node algo-2 never boots: its Python stops at start-up, before
`agent.entrypoint` runs (`tests/helpers/hold_boot/sitecustomize.py` on the job's PYTHONPATH), so
it never heartbeats, while algo-1's agent runs and waits in torchrun's rendezvous for its peer.
Before `first_heartbeat_s`, such an attempt stayed Running until `max_runtime_s`.
"""

from __future__ import annotations

import pytest

from devtools.harness.control_plane import REPO, ControlPlane, write_spec

pytestmark = pytest.mark.slow

FIRST_HEARTBEAT_S = 6.0


@pytest.fixture
def cp(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    plane = ControlPlane(home).start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()  # the held node's process too (it carries its AERIE_ML_ROOT)


def test_a_node_that_never_reports_is_lost_within_first_heartbeat_s_and_the_job_restarts(cp, tmp_path):
    spec = write_spec(
        tmp_path / "spec.json",
        name="never-reports",
        entrypoint=["python", "-c", "print('ranks ran')"],
        resources={"instance_count": 2, "procs_per_node": 1},
        retry={"max_restarts": 1},
        health={"first_heartbeat_s": FIRST_HEARTBEAT_S, "heartbeat_s": 1.0},
        env={"PYTHONPATH": str(REPO / "tests" / "helpers" / "hold_boot"), "TEST_HOLD_NODE": "attempt-1/algo-2"},
    )
    cp.cli("submit", str(spec), check=True)
    job = cp.wait_state("never-reports", {"Completed", "Failed"}, timeout_s=120)
    assert job["state"] == "Completed", job
    first, second = sorted(job["attempt_list"], key=lambda a: a["number"])
    reason = first["reason"]
    assert first["state"] == "Failed" and reason["kind"] == "node.lost" and reason["host"] == "algo-2"
    assert "never reported" in reason["message"] and reason["evidence"]["never_reported"] is True
    assert reason["evidence"]["reported"] == ["algo-1"]  # its healthy peer was heard from all along
    # Declared lost once first_heartbeat_s had passed since launch, and not much later (reconcile
    # passes are 0.3 s apart here; the rest is the launch itself on a busy machine).
    took = first["ended_at"] - first["started_at"]
    assert FIRST_HEARTBEAT_S <= took <= FIRST_HEARTBEAT_S + 4, took
    [verdict] = [v for v in job["verdicts"] if v["attempt_id"] == first["id"]]
    assert verdict["host"] == "algo-2" and verdict["kind"] == "node.lost"
    assert second["state"] == "Completed"
    assert "ranks ran" in cp.cli("logs", "never-reports", check=True).stdout
