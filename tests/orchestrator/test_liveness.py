"""The two ways a node is lost: it stopped reporting, or it never reported."""

from __future__ import annotations

from aerie_contracts.health import HealthSettings
from orchestrator.liveness import never_reported, stopped_reporting

T0 = 1_000.0


def test_a_node_that_stopped_heartbeating_is_lost_after_the_limit():
    beats = {"algo-1": T0 + 20, "algo-2": T0 + 5}
    states = {"algo-1": "Running", "algo-2": "Running"}
    assert stopped_reporting(beats, states, T0 + 19, limit_s=15) is None
    lost = stopped_reporting(beats, states, T0 + 21, limit_s=15)
    assert lost.host == "algo-2" and lost.reason["kind"] == "node.lost" and lost.evidence["limit_s"] == 15
    # Nodes that never reported are not this rule's (nor are nodes no longer running).
    assert stopped_reporting({"algo-1": None}, {"algo-1": "Running"}, T0 + 100, 15) is None
    assert stopped_reporting({"algo-1": T0}, {"algo-1": "Completed"}, T0 + 100, 15) is None


def test_a_node_that_never_reported_is_named_after_first_heartbeat_s():
    beats = {"algo-1": T0 + 2, "algo-2": None}
    polled = [("algo-1", "Running"), ("algo-2", "Starting")]
    assert never_reported(beats, polled, 2, booted_at=T0, now=T0 + 9, limit_s=10) is None
    lost = never_reported(beats, polled, 2, booted_at=T0, now=T0 + 11, limit_s=10)
    assert lost.host == "algo-2" and lost.reason["host"] == "algo-2"
    assert lost.reason["kind"] == "node.lost" and "never reported" in lost.reason["message"]
    assert lost.evidence == {
        "never_reported": True,
        "waited_s": 11.0,
        "first_heartbeat_s": 10,
        "reported": ["algo-1"],
        "expected": 2,
    }
    assert lost.reason["evidence"] == lost.evidence


def test_nodes_that_ended_or_reported_are_not_lost():
    polled = [("algo-1", "Completed"), ("algo-2", "Running")]
    assert never_reported({"algo-1": None, "algo-2": T0 + 1}, polled, 2, T0, T0 + 500, 10) is None


def test_a_node_the_backend_cannot_name_is_still_lost():
    """Slurm lists only the nodes whose agent started: one that never did is missing by count."""
    lost = never_reported({"node1": T0 + 1}, [("node1", "Running")], 2, T0, T0 + 11, 10)
    assert lost.host is None and "host" not in lost.reason
    assert "1 of 2 node(s) never reported" in lost.reason["message"]


def test_the_default_leaves_room_for_a_cold_start():
    assert HealthSettings().first_heartbeat_s == 120.0
