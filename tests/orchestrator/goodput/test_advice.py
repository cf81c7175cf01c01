"""Checkpoint-interval advice: the Young–Daly formula, the MTBF the fleet shows, and a simulated
run (orchestrator/goodput/simulate.py, the same failures for every interval) in which the advised
interval beats half and twice of it."""

from __future__ import annotations

import math
import random

import pytest

from aerie_contracts.goodput import Category
from orchestrator.goodput import advice, simulate
from orchestrator.goodput.trace import AttemptTrace, CheckpointTrace, JobTrace
from orchestrator.store import Database, repo


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
