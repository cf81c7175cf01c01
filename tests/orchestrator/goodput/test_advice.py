"""Checkpoint-interval advice per tier: the Young–Daly formula, the MTBF the fleet shows (for the
memory tier: the failures it recovers from), the memory tier's measured snapshot stall, and a
simulated run (devtools/goodput_simulate.py, the same failures for every interval) in which the
advised interval beats half and twice of it."""

from __future__ import annotations

import math
import random

import pytest

from aerie_contracts.goodput import Category
from devtools import goodput_simulate as simulate
from orchestrator.goodput import advice, ledger_for
from orchestrator.goodput.trace import AttemptTrace, CheckpointTrace, JobTrace
from orchestrator.store import Database, repo

MEMORY_SPEC = {
    "backend": "local",
    "resources": {"instance_count": 2},
    "retry": {"max_restarts": 3},
    "checkpoint": {"s3_uri": "s3://b/c", "every_steps": 100, "memory_every_steps": 5},
}


def test_young_daly_formula_and_expected_waste():
    assert advice.young_daly(60, 6 * 3600) == pytest.approx(math.sqrt(2 * 60 * 6 * 3600))
    tau = advice.young_daly(5, 1000)
    assert tau == pytest.approx(100)
    w = advice.expected_waste(tau, 5, 1000)
    assert w == pytest.approx(5 / 100 + 100 / 2000)
    assert w < advice.expected_waste(tau / 2, 5, 1000) and w < advice.expected_waste(tau * 2, 5, 1000)
    with pytest.raises(ValueError):
        advice.young_daly(0, 100)


def test_advice_of_a_job_uses_its_measured_stall_and_step_time():
    pts = [(i, i * 2.0 + (4.0 if i > 10 else 0.0) + (4.0 if i > 20 else 0.0)) for i in range(1, 31)]
    a = AttemptTrace(1, "Running", 0.0, 0.0, points=pts)
    ck = [CheckpointTrace(1, 10, 30.0, None, 0.0), CheckpointTrace(1, 20, 30.0, None, 0.0)]
    t = JobTrace("j", "j", "InProgress", 4, 0.0, None, 100.0, every_steps=10, attempts=[a], checkpoints=ck)
    adv = advice.advise(t, node_mtbf_s=40_000, source="setting")
    assert adv is not None and adv["tier"] == "s3" and adv["failures"] == advice.FAILURES[advice.CheckpointTier.S3]
    assert advice.advise(t, 40_000, "setting", advice.CheckpointTier.MEMORY) is None  # no memory tier
    assert adv["save_stall_s"] == pytest.approx(4) and adv["step_s"] == pytest.approx(2)
    assert adv["mtbf_s"] == pytest.approx(10_000)  # four nodes: four times the failure rate
    assert adv["advised_interval_s"] == pytest.approx(math.sqrt(2 * 4 * 10_000))
    assert adv["advised_every_steps"] == round(math.sqrt(2 * 4 * 10_000) / 2)
    assert adv["current_interval_s"] == 20
    assert adv["current_badput"] == pytest.approx(4 / 20 + 20 / 20_000)
    assert adv["advised_badput"] < adv["current_badput"]


def test_fleet_mtbf_counts_infrastructure_failures_once_there_are_enough(tmp_path, monkeypatch):
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    monkeypatch.setenv("AERIE_MTBF_H", "100")
    assert advice.setting_node_mtbf_s() == 360_000
    with db.session() as s:
        job = repo.create_job(s, {"name": "f", "backend": "local", "resources": {"instance_count": 2}}, "default")
        for n, kind in enumerate(["node.lost", "silent.hang", "user.error", "loss.nan", "exit.nonzero"], 1):
            a = repo.create_attempt(s, job, n)
            repo.set_attempt_state(s, a, "Failed", {"kind": kind})
            a.started_at, a.ended_at = 0.0, 1000.0
        s.flush()
        mtbf, failures, node_s = advice.fleet_node_mtbf_s(s, now=2000.0)
    db.dispose()
    # node.lost, silent.hang, exit.nonzero count; a user error and a NaN loss are not the fleet's.
    assert (failures, node_s) == (3, 10_000) and mtbf == pytest.approx(10_000 / 3)


def test_the_advised_interval_beats_half_and_twice_of_it_in_a_simulated_run():
    stall, mtbf, restart = 30.0, 3 * 3600.0, 120.0
    tau = advice.young_daly(stall, mtbf)
    horizon = 400 * mtbf
    goodput = {}
    for factor in (0.5, 1.0, 2.0):
        total = 0.0
        for seed in range(3):
            failures = simulate.failure_trace(horizon, 1 / mtbf, [("any", 1.0)], random.Random(seed))
            policy = simulate.Policy(f"x{factor}", tau * factor, stall, lambda _c: simulate.Recovery(0.0, restart, 0.0))
            result = simulate.run(horizon, failures, policy)
            assert sum(result["categories_s"].values()) - result["categories_s"][Category.PRODUCTIVE] == pytest.approx(
                result["badput_s"]
            )
            assert sum(result["categories_s"].values()) == pytest.approx(horizon)
            total += result["goodput"]
        goodput[factor] = total / 3
    assert goodput[1.0] > goodput[0.5] and goodput[1.0] > goodput[2.0], goodput
    # And the first-order model predicts the simulated waste within a point.
    predicted = advice.expected_waste(tau, stall, mtbf) + restart / mtbf
    assert 1 - goodput[1.0] == pytest.approx(predicted, abs=0.01)


def _memory_job(snapshot_s: float | None, memory_every: int | str = 5) -> JobTrace:
    """Steps of 0.5 s; a snapshot every 5 steps whose step takes 0.1 s longer; an S3 save at 50."""
    pts = [(i, 0.5 * i + 0.1 * ((i - 1) // 5)) for i in range(1, 61)]
    a = AttemptTrace(1, "Running", 0.0, 0.0, points=pts, snapshot_s=snapshot_s)
    memory = [CheckpointTrace(1, s, None, None, 0.0, tier="memory") for s in range(5, 61, 5)]
    spec = {**MEMORY_SPEC, "checkpoint": {**MEMORY_SPEC["checkpoint"], "memory_every_steps": memory_every}}
    return JobTrace(
        "j",
        "j",
        "InProgress",
        2,
        0.0,
        None,
        100.0,
        every_steps=100,
        attempts=[a],
        checkpoints=[*memory, CheckpointTrace(1, 50, 3.0, None, 0.0)],
        backend="local",
        memory_every_steps=memory_every if isinstance(memory_every, int) else None,
        spec=spec,
    )


def test_memory_tier_advice_uses_the_reported_snapshot_stall():
    t = _memory_job(snapshot_s=0.02)
    adv = advice.advise(t, node_mtbf_s=7200, source="setting", tier=advice.CheckpointTier.MEMORY)
    assert adv is not None and adv["tier"] == "memory"
    c, mtbf, d = 0.02, 3600.0, 0.5  # the agents' measurement, not the 0.1 s the step gaps show
    assert (adv["save_stall_s"], adv["mtbf_s"], adv["step_s"]) == pytest.approx((c, mtbf, d))
    assert adv["advised_interval_s"] == pytest.approx(math.sqrt(2 * c * mtbf))
    assert adv["advised_every_steps"] == round(math.sqrt(2 * c * mtbf) / d)
    assert (adv["current_every_steps"], adv["current_interval_s"]) == (5, pytest.approx(2.5))
    assert adv["current_badput"] == pytest.approx(c / 2.5 + 2.5 / (2 * mtbf))
    assert adv["advised_badput"] == pytest.approx(advice.expected_waste(math.sqrt(2 * c * mtbf), c, mtbf))
    assert adv["advised_badput"] < adv["current_badput"]
    # Unmeasured (another agent version): the stall of the step after each snapshot.
    unmeasured = advice.advise(_memory_job(None), 7200, "setting", advice.CheckpointTier.MEMORY)
    assert unmeasured is not None and unmeasured["save_stall_s"] == pytest.approx(0.1)
    # `auto`: the interval the snapshots were taken at.
    auto = advice.advise(_memory_job(0.02, "auto"), 7200, "setting", advice.CheckpointTier.MEMORY)
    assert auto is not None and auto["current_every_steps"] == 5
    # Off: no advice for it.
    assert advice.advise(_memory_job(0.02, 0), 7200, "setting", advice.CheckpointTier.MEMORY) is None


def test_the_memory_tiers_mtbf_counts_the_failures_it_recovers_from(tmp_path):
    """Four node losses and three crashes: on a backend whose relaunch loses the nodes' memory only
    the crashes (restarted in place) are the memory tier's; on the local backend all seven are."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as s:
        job = repo.create_job(s, {"name": "f", "backend": "local", "resources": {"instance_count": 2}}, "default")
        kinds = ["node.lost"] * 4 + ["exit.nonzero"] * 3
        for n, kind in enumerate(kinds, 1):
            a = repo.create_attempt(s, job, n)
            repo.set_attempt_state(s, a, "Failed", {"kind": kind})
            a.started_at, a.ended_at = 0.0, 1000.0
        s.flush()
        seen = advice.fleet(s, now=2000.0)
    db.dispose()
    node_s = 7 * 1000.0 * 2
    assert seen.node_mtbf_s() == pytest.approx(node_s / 7)
    assert seen.node_mtbf_s(advice.CheckpointTier.S3, "sagemaker") == pytest.approx(node_s / 7)
    assert seen.node_mtbf_s(advice.CheckpointTier.MEMORY, "sagemaker") == pytest.approx(node_s / 3)
    assert seen.node_mtbf_s(advice.CheckpointTier.MEMORY, "local") == pytest.approx(node_s / 7)


def test_the_ledger_carries_advice_for_each_measured_tier(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as s:
        job = repo.create_job(s, {"name": "m", **MEMORY_SPEC}, "default")
        a = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, a, "Running")
        a.created_at, a.started_at = job.created_at, job.created_at + 1
        t0 = job.created_at + 5
        repo.record_metrics(s, a, [{"step": i, "t": t0 + 0.5 * i + (0.4 if i > 50 else 0)} for i in range(1, 61)])
        repo.record_checkpoint(s, a, 50, "s3://b/c/j/step_00000050/attempt_0001", {"save_s": 3.0})
        for step in range(5, 61, 5):
            uri = f"mem://{job.id}/step_{step:08d}/attempt_0001"
            meta = {"node": "algo-1", "ranks": [0, 1], "world_size": 2, "size_bytes": 1}
            repo.record_checkpoint(s, a, step, uri, meta, tier="memory")
        repo.record_heartbeat(s, a, "algo-1", {"t": t0, "snapshot_stall_s": 0.01})
        s.flush()
        led = ledger_for(s, job, now=t0 + 40)
    db.dispose()
    tiers = {adv["tier"]: adv for adv in led["advice"]}
    assert set(tiers) == {"s3", "memory"}
    assert tiers["s3"]["save_stall_s"] == pytest.approx(0.4) and tiers["s3"]["current_every_steps"] == 100
    assert tiers["memory"]["save_stall_s"] == pytest.approx(0.01) and tiers["memory"]["current_every_steps"] == 5


def test_every_steps_auto_gets_its_allocations_mtbf_at_launch(tmp_path, monkeypatch):
    from orchestrator.store.models import Job

    monkeypatch.setenv("AERIE_MTBF_H", "10")
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as s:
        auto = {"name": "a", **MEMORY_SPEC, "checkpoint": {"s3_uri": "s3://b/c", "every_steps": "auto"}}
        job = repo.create_job(s, auto, "default")
        fixed = repo.create_job(s, {"name": "f", **MEMORY_SPEC}, "default")
        # Too few failures seen: the setting's 10 h per node, over the job's 2 nodes.
        assert advice.checkpoint_mtbf_env(s, job, now=0.0) == {"AERIE_CHECKPOINT_MTBF_S": "18000.0"}
        assert advice.checkpoint_mtbf_env(s, fixed, now=0.0) == {}
        for n in range(1, 4):  # three crashes in 3 x 1000 s of 2 nodes: 2000 node-seconds each
            a = repo.create_attempt(s, fixed, n)
            repo.set_attempt_state(s, a, "Failed", {"kind": "exit.nonzero"})
            a.started_at, a.ended_at = 0.0, 1000.0
        s.flush()
        assert advice.checkpoint_mtbf_env(s, s.get(Job, job.id), now=0.0) == {"AERIE_CHECKPOINT_MTBF_S": "1000.0"}
    db.dispose()
