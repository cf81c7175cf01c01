"""The goodput ledger of the chaos run against what the run injected (issue 24, acceptance 1).

Called from tests/chaos/test_chaos.py after its own checks, on the same job (no second run):

- the ledger's parts sum to the job's wall time (submitted → ended, from the job record) × nodes
  within 1 %;
- one fault per injected trainer fault, with the failure kind the chaos test expects;
- each fault's last step is the step before the injected one (the fault fires before that step; a
  NaN loss may record the step itself), the last rank 0 finished before the verdict (a hung step
  may finish while the ranks are stopped), and its time is that step's time in rank 0's own
  metrics file — so the fault happened right there;
- detection delay (last step → verdict or the attempt's end): a hang is called no sooner than the
  spec's hang floor and well within a minute after it; a crash or a NaN within seconds;
- redone steps = the last step the faulty attempt trained − the step the next attempt's ranks
  restored (in place or relaunched; from memory or S3), the next attempt did train them (its own
  metrics hold those steps), and they cost it time (redone seconds > 0).
"""

from __future__ import annotations

from typing import Any

import pytest

from aerie_contracts.health import HealthSettings
from aerie_contracts.metrics import MetricEvent
from devtools.harness.jobs import FAST_HEALTH, attempt_step_records

HANG_SLACK_S = 45.0  # a hang verdict after the floor: a heartbeat or two, a loaded 2-core machine
QUICK_S = 30.0  # a crash or a NaN: the next heartbeat and the controller's reconcile pass


def check_chaos_ledger(cp, job: dict, faults: list[dict[str, Any]], reasons: list[str]) -> dict[str, Any]:
    led: dict[str, Any] = cp.get(f"/v1/jobs/{job['id']}/goodput")  # type: ignore[assignment]
    nodes = led["nodes"]
    wall = job["ended_at"] - job["created_at"]
    assert sum(led["categories"].values()) == pytest.approx(wall * nodes, rel=0.01), led["categories"]
    assert led["node_seconds"] == pytest.approx(wall * nodes, rel=0.01)
    assert 0 < led["goodput"] < 1 and led["categories"]["productive"] > 0

    attempts = {a["number"]: a for a in job["attempt_list"]}
    assert [f["attempt"] for f in led["faults"]] == [f["attempt"] for f in faults], led["faults"]
    assert [f["kind"] for f in led["faults"]] == reasons
    jobs_dir = cp.home / "jobs" / job["id"]
    for injected, got in zip(faults, led["faults"], strict=True):
        n = got["attempt"]
        own = {r["step"]: r["t"] for r in attempt_step_records(jobs_dir, n, 0)}
        allowed = {injected["step"] - 1} | ({injected["step"]} if injected["kind"] == "nan" else set())
        assert got["last_step"] in allowed, (injected, got)
        if injected["kind"] == "nan":  # ranks train on past a NaN until the verdict stops them
            assert got["last_step"] <= max(own), (got, max(own))
        else:  # a step its ranks finished while being stopped (after the verdict) is not the fault's
            before = [s for s, t in own.items() if got["verdict_t"] is None or t <= got["verdict_t"]]
            assert got["last_step"] == max(before), (got, max(before))
        # The step's time is its first record's: the trainer's own, or the in-process probe's at
        # the end of its optimizer step (the same stream, a few milliseconds earlier).
        times = [r["t"] for r in attempt_step_records(jobs_dir, n, 0, probe=True) if r["step"] == got["last_step"]]
        assert any(got["last_step_t"] == pytest.approx(t, abs=1e-3) for t in times), (got, times)
        if got["kind"] == "silent.hang":
            floor = FAST_HEALTH["hang_floor_s"]
            if injected["kind"] == "sigstop":  # a stopped rank: the learned limit (agent/detect.py)
                floor = min(floor, FAST_HEALTH.get("stopped_floor_s", HealthSettings().stopped_floor_s))
            assert floor <= got["detection_s"] <= floor + HANG_SLACK_S, got
            assert got["verdict_t"] is not None
        else:
            assert 0 <= got["detection_s"] <= QUICK_S, got
        # The next attempt resumed where its ranks say they restored (a memory resume point whose
        # snapshot a rank could not read falls back to S3, further back), in place or relaunched.
        nxt = attempts[n + 1]
        restored = attempt_step_records(jobs_dir, n + 1, None, MetricEvent.RESTORED)
        resumed = min(int(r["step"]) for r in restored) if restored else nxt["resumed_step"]
        assert got["resumed_step"] == resumed, (got, restored)
        trained = got["last_step"] if injected["kind"] == "nan" else max(own)  # a NaN's later steps are void
        assert got["redone_steps"] == trained - resumed, got
        redone_by_next = {r["step"] for r in attempt_step_records(jobs_dir, n + 1, 0)}
        assert set(range(resumed + 1, trained + 1)) <= redone_by_next
        assert got["redone_steps"] == 0 or got["redone_s"] > 0
    return led
