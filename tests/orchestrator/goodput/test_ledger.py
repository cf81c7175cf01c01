"""The goodput ledger on synthetic store contents: a known history (launch, start-up, a checkpoint
stall, a hang detected after 7 s, a resume that redoes 5 steps, a final save) gives known totals,
and any history at all sums to wall time × nodes."""

from __future__ import annotations

import itertools
import random

import pytest

from aerie_contracts.goodput import Category
from orchestrator.goodput import ledger, ledger_for
from orchestrator.goodput.trace import AttemptTrace, CheckpointTrace, JobTrace
from orchestrator.store import repo
from orchestrator.store.models import Job, Verdict

T0 = 1000.0


def _history(s) -> Job:
    """Two nodes; attempt 1 hangs after step 25 (checkpoint at 10 with a 3 s stall); attempt 2
    resumes from step 20 and completes at step 40 with a final 2 s save."""
    spec = {
        "name": "ledger",
        "backend": "local",
        "resources": {"instance_count": 2},
        "checkpoint": {"s3_uri": "s3://b/c", "every_steps": 10},
    }
    job = repo.create_job(s, spec, "default")
    job.created_at = T0
    a1 = repo.create_attempt(s, job, 1)
    repo.set_attempt_state(s, a1, "Running")
    a1.created_at, a1.started_at = T0, T0 + 10
    repo.record_metrics(s, a1, [{"step": i, "t": 1030 + (i - 1) + (3 if i > 10 else 0)} for i in range(1, 26)])
    repo.record_checkpoint(s, a1, 10, "s3://b/c/j/step_00000010/attempt_0001", {"save_s": 9.0})
    repo.record_checkpoint(s, a1, 20, "s3://b/c/j/step_00000020/attempt_0001", {"save_s": 9.0})
    s.add(Verdict(attempt_id=a1.id, host="n1", kind="silent.hang", t=1064.0))
    repo.set_attempt_state(s, a1, "Failed", {"kind": "silent.hang"})
    a1.ended_at = 1066.0
    s.flush()
    a2 = repo.create_attempt(s, job, 2, resume_from="s3://b/c/j/step_00000020/attempt_0001")
    repo.set_attempt_state(s, a2, "Running")
    a2.created_at, a2.started_at = 1068.0, 1071.0
    repo.record_metrics(s, a2, [{"step": i, "t": 1095 + (i - 21)} for i in range(21, 41)])
    repo.record_checkpoint(s, a2, 40, "s3://b/c/j/step_00000040/attempt_0002", {"save_s": 2.0})
    repo.set_attempt_state(s, a2, "Completed")
    a2.ended_at = 1117.0
    repo.set_job_state(s, job, "Completed")
    job.ended_at = 1118.0
    s.flush()
    return job


def test_a_known_history_gives_known_totals(sqlite_db):
    with sqlite_db.session() as s:
        led = ledger_for(s, _history(s))
    c = led["categories"]
    expected = {
        Category.LAUNCH: 13,
        Category.STARTUP: 38,
        Category.RESTORE: 4,
        Category.PRODUCTIVE: 40,
        Category.CHECKPOINT_STALL: 5,
        Category.DETECTION: 7,
        Category.RESTART: 6,
        Category.REDONE: 5,
        Category.PREFLIGHT: 0,
        Category.EVAL: 0,
        Category.IDLE: 0,
    }
    assert c == pytest.approx({k.value: 2 * v for k, v in expected.items()})
    assert led["wall_s"] == 118 and led["node_seconds"] == 236
    assert sum(c.values()) == pytest.approx(led["node_seconds"], rel=1e-12)
    assert led["goodput"] == pytest.approx(40 / 118)
    [fault] = led["faults"]
    assert fault["kind"] == "silent.hang" and fault["last_step"] == 25
    assert fault["detection_s"] == pytest.approx(7)
    assert (fault["resumed_step"], fault["redone_steps"]) == (20, 5)
    assert fault["redone_s"] == pytest.approx(10)
    # The segments tile the timeline with no gap or overlap.
    segs = led["segments"]
    assert segs[0]["start"] == T0 and segs[-1]["end"] == 1118
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(segs))


def test_advice_comes_with_the_ledger(sqlite_db):
    with sqlite_db.session() as s:
        led = ledger_for(s, _history(s))
    [adv] = led["advice"]  # the S3 tier's: the job has no memory tier
    assert adv["tier"] == "s3" and adv["mtbf_source"] == "setting"
    assert adv["save_stall_s"] == pytest.approx(1.5)  # median of 3 s (step 10) and 0 s (step 20)
    assert adv["current_every_steps"] == 10 and adv["step_s"] == pytest.approx(1)
    assert adv["advised_interval_s"] == pytest.approx((2 * 1.5 * adv["mtbf_s"]) ** 0.5)


def test_a_job_without_attempts_is_all_launch_and_a_running_one_ends_now(sqlite_db):
    with sqlite_db.session() as s:
        job = repo.create_job(s, {"name": "q", "backend": "local"}, "default")
        job.created_at = T0
        s.flush()
        led = ledger_for(s, job, now=T0 + 30)
        assert led["categories"][Category.LAUNCH] == pytest.approx(30)
        a = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, a, "Running")
        a.created_at, a.started_at = T0 + 1, T0 + 2
        repo.record_metrics(s, a, [{"step": i, "t": T0 + 5 + i} for i in range(1, 11)])
        s.flush()
        s.expire(job)
        led = ledger_for(s, s.get(Job, job.id), now=T0 + 100)
    c = led["categories"]
    assert sum(c.values()) == pytest.approx(100)
    assert c[Category.PRODUCTIVE] == pytest.approx(10 + 2 + ledger.METRICS_DELAY_S)
    assert c[Category.IDLE] > 70  # nothing arrived for a minute and more: not counted as progress


def test_eval_pauses_and_unexplained_stalls():
    pts = [(i, float(i)) for i in range(1, 6)] + [(6, 9.0), (7, 10.0), (8, 20.0), (9, 21.0)]
    a = AttemptTrace(1, "Completed", created_at=0.0, started_at=0.0, ended_at=21.0, points=pts)
    t = JobTrace("j", "j", "Completed", 1, 0.0, 21.0, 21.0, eval_every=5, attempts=[a])
    c = ledger.compute(t)["categories"]
    assert c[Category.EVAL] == pytest.approx(3)  # step 6 took 4 s after the eval at step 5
    assert c[Category.IDLE] == pytest.approx(9)  # step 8 took 10 s for no recorded reason
    assert sum(c.values()) == pytest.approx(21)


def test_any_history_sums_to_wall_time_times_nodes():
    rng = random.Random(7)
    for _ in range(300):
        now = 1e4
        attempts, t, step = [], rng.uniform(0, 50), 0
        for n in range(1, rng.randint(0, 4) + 1):
            created = t + rng.uniform(-5, 20)
            started = created + rng.uniform(-2, 30) if rng.random() < 0.9 else None
            pts, tt = [], (started or created) + rng.uniform(-3, 40)
            resumed = rng.randint(0, step) if n > 1 else None
            for st in range((resumed or 0) + 1, (resumed or 0) + rng.randint(0, 60)):
                tt += rng.uniform(0.1, 3) * (rng.random() < 0.95 or 20)
                pts.append((st, tt))
            ended = tt + rng.uniform(-1, 30)
            step = max(step, pts[-1][0] if pts else 0)
            verdicts = [(tt + rng.uniform(-5, 10), "silent.hang")] if rng.random() < 0.5 else []
            state = rng.choice(["Failed", "Completed", "Stopped", "Running"])
            attempts.append(
                AttemptTrace(
                    n, state, created, started, None if state == "Running" else ended, resumed, "x", verdicts, pts
                )
            )
            attempts[-1].preflight_s = rng.uniform(0, 20) if rng.random() < 0.5 else None
            t = ended
        ended_at = t + rng.uniform(0, 5) if rng.random() < 0.5 else None
        ckpts = [CheckpointTrace(1, rng.randint(1, 60), rng.uniform(0, 5), None, 0.0) for _ in range(rng.randint(0, 4))]
        nodes = rng.randint(1, 8)
        trace = JobTrace(
            "j",
            "j",
            "Completed" if ended_at else "InProgress",
            nodes,
            0.0,
            ended_at,
            max(now, t),
            10,
            7,
            attempts,
            ckpts,
        )
        led = ledger.compute(trace)
        assert sum(led["categories"].values()) == pytest.approx(led["node_seconds"], rel=1e-9, abs=1e-6)
        assert all(v >= 0 for v in led["categories"].values())


def test_a_measured_restore_replaces_the_estimate(sqlite_db):
    """The agents' `restore_s` (the trainer's `restored` event) is the restore; the rest of the
    resumed attempt's start-up stays start-up."""
    with sqlite_db.session() as s:
        job = _history(s)
        a2 = job.attempts[1]
        repo.record_heartbeat(s, a2, "algo-1", {"t": 1090.0, "restore_s": 1.5})
        repo.record_heartbeat(s, a2, "algo-2", {"t": 1090.0, "restore_s": 2.5})
        s.flush()
        c = ledger_for(s, job)["categories"]
    assert c[Category.RESTORE] == pytest.approx(2 * 2.5)  # the slowest node's
    assert c[Category.STARTUP] == pytest.approx(2 * (38 + 4 - 2.5))


def test_the_agent_keeps_its_ranks_slowest_restore():
    from types import SimpleNamespace

    from agent.supervisor import Supervisor

    sup = SimpleNamespace(restore_s=None, restored_step=None)
    for rec in [
        {"event": "restored", "step": 40, "restore_s": 3.0},
        {"event": "restored", "step": 48, "restore_s": 5.0},
        {"event": "restored", "restore_s": "x"},
        {"event": None, "restore_s": 9.0, "step": 1},
        {"event": "restored", "restore_s": True},
    ]:
        Supervisor._note_restore(sup, rec)  # type: ignore[arg-type]
    assert sup.restore_s == 5.0
    assert sup.restored_step == 40  # a rank that fell back to an older checkpoint: the ranks resumed there


def test_the_agent_keeps_the_slowest_rank_of_each_recent_snapshot():
    from types import SimpleNamespace

    from agent import supervisor
    from agent.supervisor import Supervisor

    sup = SimpleNamespace(snapshot_s={})
    for step in range(1, 41):
        for rank, cost in enumerate((0.01, 0.03 if step % 2 else 0.02)):
            rec = {"event": "checkpoint_memory", "step": step, "rank": rank, "snapshot_s": cost}
            Supervisor._note_snapshot(sup, rec)  # type: ignore[arg-type]
    Supervisor._note_snapshot(sup, {"event": "checkpoint_memory", "step": 41, "snapshot_s": "x"})  # type: ignore[arg-type]
    Supervisor._note_snapshot(sup, {"event": None, "step": 42, "snapshot_s": 9.0})  # type: ignore[arg-type]
    assert sorted(sup.snapshot_s) == list(range(41 - supervisor.SNAPSHOTS_KEPT, 41))
    assert set(sup.snapshot_s.values()) == {0.02, 0.03}


def test_pre_flight_is_carved_from_start_up_and_a_failed_one_is_all_pre_flight_then_restart():
    # Attempt 1: its nodes' pre-flight took 4 s, then algo-2 failed it (verdict at 5 s): no step.
    # Attempt 2: launched at 8, started at 9, pre-flight 3 s, first step ends at 20 (1 s steps).
    a1 = AttemptTrace(1, "Failed", created_at=0.0, started_at=1.0, ended_at=6.0, verdicts=[(5.0, "preflight.failed")])
    a1.preflight_s = 4.0
    pts = [(i, 19.0 + i) for i in range(1, 6)]
    a2 = AttemptTrace(2, "Completed", created_at=8.0, started_at=9.0, ended_at=24.0, points=pts, preflight_s=3.0)
    t = JobTrace("j", "j", "Completed", 2, 0.0, 24.0, 24.0, attempts=[a1, a2])
    c = ledger.compute(t)["categories"]
    assert c[Category.PREFLIGHT] == pytest.approx(2 * (4 + 3))  # two nodes
    assert c[Category.LAUNCH] == pytest.approx(2 * (1 + 1))
    assert c[Category.STARTUP] == pytest.approx(2 * (0 + 7))  # attempt 2: 12..19 (first step began at 19)
    assert c[Category.RESTART] == pytest.approx(2 * (1 + 2))  # verdict 5 -> end 6 -> attempt 2 created at 8
    assert sum(c.values()) == pytest.approx(2 * 24)
