"""The in-place / relaunch decision (recovery/modes.py) on job documents as the API returns them."""

from __future__ import annotations

from aerie_contracts.restarts import CAUSE_MODE, RestartMode, mode_of
from recovery.modes import decide, in_place_streak, may_restart_in_place, memory_tier_off

NODES = [{"host": "algo-1"}, {"host": "algo-2"}]


def _job(backend: str = "local", budget: int | None = None, modes: tuple[str | None, ...] = (None,)) -> dict:
    """Attempts 1..len(modes), each started with the given mode (None: the first, or pre-modes)."""
    retry = {} if budget is None else {"in_place_restarts": budget}
    attempts = [
        {"number": i + 1, "nodes": NODES, "cause": None if m is None else {CAUSE_MODE: m}} for i, m in enumerate(modes)
    ]
    return {"backend": backend, "spec": {"retry": retry}, "attempt_list": attempts}


def test_a_rank_failure_on_healthy_nodes_restarts_in_place():
    job = _job()
    for kind in ("exit.nonzero", "silent.hang", "loss.nan", "checkpoint.failed"):
        mode, why = decide(job, job["attempt_list"][-1], {"kind": kind}, exclude=[])
        assert mode == RestartMode.IN_PLACE and kind in why and "1 of 2" in why, (kind, why)


def test_node_loss_an_excluded_node_and_other_backends_relaunch():
    job = _job()
    failed = job["attempt_list"][-1]
    for reason, exclude, expect in (
        ({"kind": "node.lost", "host": "algo-2"}, [], "node.lost (algo-2)"),
        ({"kind": "node.preempted"}, [], "cannot be reused"),
        ({"kind": "launch.failed"}, [], "cannot be reused"),
        ({"kind": "silent.hang", "host": "algo-2"}, ["algo-2"], "algo-2 excluded"),
    ):
        mode, why = decide(job, failed, reason, exclude)
        assert mode == RestartMode.RELAUNCH and expect in why, (reason, why)
    # A node excluded that the failed attempt did not run on needs no new allocation.
    assert decide(job, failed, {"kind": "exit.nonzero"}, ["algo-9"])[0] == RestartMode.IN_PLACE
    mode, why = decide(_job("batch"), failed, {"kind": "exit.nonzero"}, [])
    assert mode == RestartMode.RELAUNCH and "batch" in why
    # Slurm's agents stay up in the job's allocation, SageMaker's in its training job: the next
    # attempt runs inside it.
    assert decide(_job("slurm"), failed, {"kind": "exit.nonzero"}, [])[0] == RestartMode.IN_PLACE
    assert decide(_job("sagemaker"), failed, {"kind": "exit.nonzero"}, [])[0] == RestartMode.IN_PLACE
    assert decide(job, {**failed, "nodes": []}, {"kind": "exit.nonzero"}, [])[0] == RestartMode.RELAUNCH
    netns = {**job, "spec": {"backend_options": {"netns": True}}}
    assert decide(netns, failed, {"kind": "exit.nonzero"}, [])[0] == RestartMode.RELAUNCH
    # A third-party trainer's own checkpoint directory restarts in place too (its agent sets the
    # last group's files aside and keeps the resume point), but takes no memory snapshots.
    byo_spec = {
        "checkpoint": {"s3_uri": "s3://b/c", "marker": "trainer_state.json"},
        "resources": {"instance_count": 2},
    }
    byo = {**job, "spec": byo_spec}
    assert decide(byo, failed, {"kind": "exit.nonzero"}, [])[0] == RestartMode.IN_PLACE
    assert "checkpoint.marker" in (memory_tier_off({**byo_spec, "retry": {"max_restarts": 1}}, "local") or "")


def test_the_in_place_budget_counts_consecutive_in_place_restarts():
    # Attempt 3 failed, after two in-place restarts in a row (2 and 3): the default budget (2) is spent.
    job = _job(modes=(None, "in_place", "in_place"))
    mode, why = decide(job, job["attempt_list"][-1], {"kind": "exit.nonzero"}, [])
    assert mode == RestartMode.RELAUNCH and "retry.in_place_restarts=2" in why
    # A relaunch in between starts the count again.
    job = _job(modes=(None, "in_place", "relaunch", "in_place"))
    assert in_place_streak(job["attempt_list"], 4) == 1
    assert decide(job, job["attempt_list"][-1], {"kind": "exit.nonzero"}, [])[0] == RestartMode.IN_PLACE
    # 0 turns in-place restarts off.
    job = _job(budget=0)
    assert decide(job, job["attempt_list"][-1], {"kind": "exit.nonzero"}, [])[0] == RestartMode.RELAUNCH


def test_modes_read_back_and_the_controller_keeps_agents_only_where_it_may_restart_in_place():
    assert mode_of(None) == mode_of({}) == mode_of({CAUSE_MODE: "bogus"}) == RestartMode.RELAUNCH
    assert mode_of({CAUSE_MODE: "in_place"}) == RestartMode.IN_PLACE
    assert may_restart_in_place("local", {"kind": "silent.hang"}, 2)
    assert not may_restart_in_place("local", {"kind": "node.lost"}, 2)
    assert not may_restart_in_place("local", {"kind": "exit.nonzero"}, 0)
    assert not may_restart_in_place("batch", {"kind": "exit.nonzero"}, 2)
    assert may_restart_in_place("sagemaker", {"kind": "exit.nonzero"}, 2)
    assert may_restart_in_place("slurm", {"kind": "exit.nonzero"}, 2)
