"""Hot spares in chaining's decision (recovery.modes.with_spares): a relaunch forced by a lost
or excluded node becomes an in-place attempt with a spare in the failed node's rank slot."""

from __future__ import annotations

from aerie_contracts.restarts import CAUSE_MODE, RestartMode
from recovery.modes import with_spares

NODES = [{"host": "algo-1"}, {"host": "algo-2"}]


def _job(modes: tuple[str | None, ...] = (None,), spec: dict | None = None) -> dict:
    attempts = [
        {"number": i + 1, "nodes": NODES, "cause": None if m is None else {CAUSE_MODE: m}} for i, m in enumerate(modes)
    ]
    return {"backend": "local", "spec": spec or {}, "attempt_list": attempts}


def test_a_lost_node_s_slot_goes_to_a_spare_in_place():
    job = _job()
    failed = job["attempt_list"][-1]
    mode, why, replaced = with_spares(job, failed, {"kind": "node.lost", "host": "algo-2"}, ["algo-2"], ["algo-3"])
    assert mode == RestartMode.IN_PLACE and replaced == {"algo-2": "algo-3"}, why
    assert "algo-3 for algo-2" in why and "node.lost (algo-2)" in why
    # Lost but not excluded (retry.exclude_bad_nodes off): its tree is gone all the same.
    assert with_spares(job, failed, {"kind": "node.lost", "host": "algo-2"}, [], ["algo-3"])[2] == {"algo-2": "algo-3"}
    # An excluded (blamed) node after a rank failure, and a failed pre-flight, likewise.
    assert with_spares(job, failed, {"kind": "silent.hang", "host": "algo-1"}, ["algo-1"], ["algo-4"])[2] == {
        "algo-1": "algo-4"
    }
    assert with_spares(job, failed, {"kind": "preflight.failed", "host": "algo-1"}, [], ["algo-3"])[2] == {
        "algo-1": "algo-3"
    }


def test_without_enough_spares_or_in_place_room_it_relaunches():
    job = _job()
    failed = job["attempt_list"][-1]
    lost = {"kind": "node.lost", "host": "algo-2"}
    assert with_spares(job, failed, lost, ["algo-2"], [])[:1] == (RestartMode.RELAUNCH,)
    mode, why, replaced = with_spares(job, failed, lost, ["algo-1", "algo-2"], ["algo-3"])
    assert mode == RestartMode.RELAUNCH and not replaced and "1 hot spare(s)" in why
    # The attempt never had its nodes: nothing to go on with.
    assert with_spares(job, failed, {"kind": "launch.failed"}, [], ["algo-3"])[0] == RestartMode.RELAUNCH
    # The in-place budget is spent, or in-place restarts are off for the spec.
    spent = _job(modes=(None, "in_place", "in_place"))
    assert with_spares(spent, spent["attempt_list"][-1], lost, ["algo-2"], ["algo-3"])[0] == RestartMode.RELAUNCH
    netns = _job(spec={"backend_options": {"netns": True}})
    assert with_spares(netns, netns["attempt_list"][-1], lost, ["algo-2"], ["algo-3"])[0] == RestartMode.RELAUNCH
    other = {**job, "backend": "batch"}  # a backend whose restarts are all relaunches
    assert with_spares(other, failed, lost, ["algo-2"], ["algo-3"])[0] == RestartMode.RELAUNCH


def test_a_failure_that_restarts_in_place_anyway_uses_no_spare():
    job = _job()
    mode, _why, replaced = with_spares(job, job["attempt_list"][-1], {"kind": "exit.nonzero"}, [], ["algo-3"])
    assert mode == RestartMode.IN_PLACE and replaced == {}
