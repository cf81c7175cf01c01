"""The goodput ledger of an in-place restart chain, built in the store as the control plane records it:

1. attempt 1 trains steps 1-29 (memory snapshots every 4 steps, an S3 save at 20 with a 0.5 s
   stall) and crashes (no verdict);
2. attempt 2 restarts **in place** from the memory checkpoint of step 28: no launch, the same
   nodes; a retry of attempt 1's last batch of step points reaches the control plane late, under
   attempt 2 (stamped before attempt 2 existed), which also makes the store skip attempt 2's own
   step 29;
   it snapshots every 4 steps (0.05 s each, measured), hangs after step 49, the verdict comes 12 s
   later and step 50 finishes while its ranks are being stopped;
3. attempt 3 is relaunched from the memory checkpoint of step 48, but its ranks fall back to the
   S3 checkpoint of step 40 (they report restoring step 40), and completes step 60.

Every part is checked: the sum (wall × nodes), each fault's detection and redone steps and
seconds, and the restart/restore/launch parts of the in-place and the relaunched attempt.
"""

from __future__ import annotations

import pytest

from aerie_contracts.checkpoints import memory_uri
from aerie_contracts.goodput import SUMMARY_RESTORE_S, SUMMARY_RESTORED_STEP, SUMMARY_SNAPSHOT_S, Category
from aerie_contracts.restarts import CAUSE_MODE, RestartMode
from orchestrator.goodput import ledger_for
from orchestrator.store import repo
from orchestrator.store.models import Job, Verdict

T0 = 1000.0
NODES = ("algo-1", "algo-2")
SNAP = 0.05


def _points(attempt_steps: dict[int, float]) -> list[dict]:
    return [{"step": step, "t": t} for step, t in sorted(attempt_steps.items())]


def _memory(s, job, attempt, number: int, step: int) -> None:
    repo.record_checkpoint(
        s,
        attempt,
        step,
        memory_uri(job.id, step, number),
        {"node": "algo-1", "ranks": [0, 1], "world_size": 2, "size_bytes": 10},
        tier="memory",
    )


def _chain(s) -> tuple[Job, dict[str, float]]:
    spec = {
        "name": "warm",
        "backend": "local",
        "resources": {"instance_count": 2},
        "checkpoint": {"s3_uri": "s3://b/c", "every_steps": 20, "memory_every_steps": 4},
    }
    job = repo.create_job(s, spec, "default")
    job.created_at = T0
    at: dict[str, float] = {}

    # 1: steps 1-29, one a second from 1011; the S3 save at 20 stalls 0.5 s; a crash at 1042.
    a1 = repo.create_attempt(s, job, 1)
    repo.set_attempt_state(s, a1, "Running")
    a1.created_at, a1.started_at = T0, T0 + 1
    one = {i: 1010.0 + i + (0.5 if i > 20 else 0.0) for i in range(1, 30)}
    repo.record_metrics(s, a1, _points(one))
    for step in range(4, 29, 4):
        _memory(s, job, a1, 1, step)
    repo.record_checkpoint(s, a1, 20, "s3://b/c/j/step_00000020/attempt_0001", {"save_s": 2.0})
    repo.set_attempt_state(s, a1, "Failed", {"kind": "exit.nonzero"})
    a1.ended_at = at["end1"] = 1042.0
    s.flush()

    # 2: in place, resumed from memory step 28.
    a2 = repo.create_attempt(s, job, 2, resume_from=memory_uri(job.id, 28, 1))
    a2.cause = {CAUSE_MODE: RestartMode.IN_PLACE.value, "failed_attempt": 1}
    repo.set_attempt_state(s, a2, "Running")
    a2.created_at, a2.started_at = 1042.5, 1042.6
    # Attempt 1's last batch (steps 28, 29) again, a retry delivered under attempt 2: not attempt 2's.
    repo.record_metrics(s, a2, _points({28: one[28], 29: one[29]}))
    snaps = range(32, 49, 4)
    two = {i: 1051.0 + (i - 30) + SNAP * sum(1 for m in snaps if m < i) for i in range(29, 50)}
    repo.record_metrics(s, a2, _points(two))  # its own step 29 is skipped: the store has a step 29
    for step in snaps:
        _memory(s, job, a2, 2, step)
    repo.record_checkpoint(s, a2, 40, "s3://b/c/j/step_00000040/attempt_0002", {"save_s": 1.0})
    at["t49"] = two[49]
    s.add(Verdict(attempt_id=a2.id, host="algo-2", kind="silent.hang", t=two[49] + 12))
    repo.record_metrics(s, a2, _points({50: two[49] + 13}))  # finished while stopping
    for host in NODES:
        repo.record_heartbeat(
            s, a2, host, {"t": 1060.0, SUMMARY_RESTORE_S: 0.3, SUMMARY_RESTORED_STEP: 28, SUMMARY_SNAPSHOT_S: SNAP}
        )
    repo.set_attempt_state(s, a2, "Failed", {"kind": "silent.hang"})
    a2.ended_at = at["end2"] = two[49] + 14
    s.flush()

    # 3: relaunched from memory step 48; its ranks fell back to S3 step 40.
    a3 = repo.create_attempt(s, job, 3, resume_from=memory_uri(job.id, 48, 2))
    a3.cause = {CAUSE_MODE: RestartMode.RELAUNCH.value, "failed_attempt": 2}
    repo.set_attempt_state(s, a3, "Running")
    a3.created_at, a3.started_at = at["end2"] + 1, at["end2"] + 3
    three = {i: at["end2"] + 13 + (i - 41) for i in range(41, 61)}
    repo.record_metrics(s, a3, _points(three))
    for host in NODES:
        repo.record_heartbeat(s, a3, host, {"t": three[50], SUMMARY_RESTORE_S: 1.0, SUMMARY_RESTORED_STEP: 40})
    repo.record_checkpoint(s, a3, 60, "s3://b/c/j/step_00000060/attempt_0003", {"save_s": 0.5})
    repo.set_attempt_state(s, a3, "Completed")
    a3.ended_at = three[60] + 1
    repo.set_job_state(s, job, "Completed")
    job.ended_at = at["job_end"] = three[60] + 1.5
    s.flush()
    at.update(first2=two[30], first3=three[41], created3=a3.created_at, started3=a3.started_at)
    return job, at


def _seconds(led: dict, category: str, attempt: int) -> float:
    return sum(g["end"] - g["start"] for g in led["segments"] if g["category"] == category and g["attempt"] == attempt)


def test_an_in_place_chain_is_accounted_for_in_every_part(sqlite_db):
    with sqlite_db.session() as s:
        job, at = _chain(s)
        led = ledger_for(s, job)
    nodes = len(NODES)
    wall = at["job_end"] - T0
    c = led["categories"]
    assert sum(c.values()) == pytest.approx(wall * nodes, rel=0.01)
    assert sum(c.values()) == pytest.approx(led["node_seconds"], rel=1e-9)
    assert all(v >= 0 for v in c.values())

    crash, hang = led["faults"]
    # 1. The crash: detected when the attempt ended; attempt 2 redid step 29 (its line was lost,
    # its time is not: the two steps from the resume point to the first point took 2 s).
    assert (crash["last_step"], crash["verdict_t"]) == (29, None)
    assert crash["detection_s"] == pytest.approx(at["end1"] - 1039.5)
    assert (crash["resumed_step"], crash["redone_steps"]) == (28, 1)
    assert crash["redone_s"] == pytest.approx(1.0 * nodes)

    # 2. The hang: its fault is step 49's end, not step 50 (finished after the verdict).
    assert hang["last_step"] == 49 and hang["last_step_t"] == pytest.approx(at["t49"])
    assert hang["detection_s"] == pytest.approx(12)
    # Attempt 3 resumed at 40 (the S3 fallback), not 48: it redid 41-50.
    assert (hang["resumed_step"], hang["redone_steps"]) == (40, 10)
    # How each next attempt started, and the seconds from detection to its first step.
    assert (crash["restart_mode"], hang["restart_mode"]) == (RestartMode.IN_PLACE, RestartMode.RELAUNCH)
    assert crash["recovery_s"] == pytest.approx(at["first2"] - at["end1"])
    assert hang["recovery_s"] == pytest.approx(at["first3"] - hang["verdict_t"])
    assert hang["redone_s"] == pytest.approx(10 * nodes)
    for f in led["faults"]:
        assert f["redone_steps"] == 0 or f["redone_s"] > 0, f

    # In place: nothing launched or started up, the new worker group's start is restart (from
    # attempt 1's end), less the measured restore; its snapshots stalled 0.05 s each.
    assert _seconds(led, Category.LAUNCH, 2) == 0 and _seconds(led, Category.STARTUP, 2) == 0
    began2 = at["first2"] - 2.0
    assert _seconds(led, Category.RESTART, 2) == pytest.approx(began2 - 0.3 - at["end1"] + 2.0)  # + its teardown
    assert _seconds(led, Category.RESTORE, 2) == pytest.approx(0.3)
    assert _seconds(led, Category.CHECKPOINT_STALL, 2) == pytest.approx(5 * SNAP)
    assert _seconds(led, Category.DETECTION, 2) == pytest.approx(12)
    assert _seconds(led, Category.IDLE, 2) == 0
    assert _seconds(led, Category.REDONE, 2) == pytest.approx(1.0)
    # Relaunched: launch and start-up as for any new allocation; the measured restore.
    assert _seconds(led, Category.LAUNCH, 3) == pytest.approx(at["started3"] - at["created3"])
    assert _seconds(led, Category.RESTORE, 3) == pytest.approx(1.0)
    assert _seconds(led, Category.STARTUP, 3) == pytest.approx(at["first3"] - 1.0 - 1.0 - at["started3"])
    assert _seconds(led, Category.REDONE, 3) == pytest.approx(10)
    # Attempt 1: its S3 save's 0.5 s stall, nothing else between steps.
    assert _seconds(led, Category.CHECKPOINT_STALL, 1) == pytest.approx(0.5)
    assert c[Category.CHECKPOINT_STALL] == pytest.approx((0.5 + 5 * SNAP + 0.5) * nodes)  # + the final save's


def test_a_late_batch_of_the_attempt_before_is_not_the_successors(sqlite_db):
    """Points stamped before their attempt was created are left out of its trace."""
    from orchestrator.goodput import trace

    with sqlite_db.session() as s:
        job, _ = _chain(s)
        t = trace.read(s, job)
    second = t.attempts[1]
    assert second.points[0][0] == 30 and all(pt >= second.created_at for _, pt in second.points)
    assert second.mode == RestartMode.IN_PLACE and t.attempts[2].mode == RestartMode.RELAUNCH
    assert second.snapshot_s == SNAP and t.attempts[2].resumed_step == 40


def test_a_nan_is_detected_from_its_step_and_steps_after_the_verdict_are_teardown():
    """A NaN at step 10 (steps 1-9 good): the ranks train on to step 14, the verdict comes after
    step 12's point; 10 → verdict is detection, steps finished after it teardown."""
    from orchestrator.goodput import ledger
    from orchestrator.goodput.trace import AttemptTrace, JobTrace

    pts = [(i, 10.0 + i) for i in range(1, 15)]
    a = AttemptTrace(1, "Failed", 0.0, 1.0, 26.0, reason_kind="loss.nan", points=pts)
    a.verdicts, a.loss_fault_step = [(22.5, "loss.nan")], 10
    led = ledger.compute(JobTrace("j", "j", "Failed", 1, 0.0, 26.0, 26.0, attempts=[a]))
    [fault] = led["faults"]
    assert (fault["last_step"], fault["detection_s"]) == (10, pytest.approx(2.5))
    assert led["categories"][Category.DETECTION] == pytest.approx(2.5)
    assert led["categories"][Category.RESTART] == pytest.approx(26 - 22.5)
    assert led["categories"][Category.PRODUCTIVE] == pytest.approx(10)  # steps 1-10 (10 is the fault's)
