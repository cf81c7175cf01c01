"""The chaos run: a job survives kill -9 of a rank, a SIGSTOP hang, a busy hang, a NaN loss, S3
going unreachable during a save, and kill -9 of the control plane, and finishes every step with
exactly the losses of an uninterrupted run after each resume point.

Everything is real: `aerie up`, agents, torchrun/gloo, the loopback S3 server (moto, paused with
SIGSTOP for the outage so its in-memory objects survive), the chain_restart handler.
"""

from __future__ import annotations

import pytest

from aerie_checkpoint.manifest import verify
from aerie_contracts.checkpoints import MEMORY_GONE_ATTEMPT_ENDED, CheckpointTier, tier_of_uri
from aerie_contracts.restarts import CAUSE_MODE, RestartMode
from devtools.harness.chaos import EXPECTED_REASONS, TRAINER_FAULTS, run_chaos
from tests.helpers.goodput_checks import check_chaos_ledger
from tests.helpers.planes import running_control_plane

pytestmark = pytest.mark.slow

# Shorter than the bench's 300: the faults end by step 90 and the last attempt trains ~100-120 by the
# time the control plane is back (S3 is paused across a save first), so 200 still leaves ~80 steps
# after the restart; each 100 steps fewer is ~12 s of the reference run and ~12 s of the last attempt.
STEPS = 200


@pytest.fixture
def cp(tmp_path):
    with running_control_plane(tmp_path / "home", s3=True) as plane:
        yield plane


def test_chaos_run_finishes_with_the_uninterrupted_losses(cp, tmp_path, monkeypatch):
    result = run_chaos(cp, tmp_path, steps=STEPS)
    job = result.job
    assert job["state"] == "Completed", (job["state"], job.get("reason"), result.timeline)
    attempts = job["attempt_list"]
    # One attempt per injected trainer fault, plus the one that finished.
    assert len(attempts) == len(TRAINER_FAULTS) + 1
    assert [a["reason"]["kind"] for a in attempts[:-1]] == EXPECTED_REASONS
    assert attempts[-1]["state"] == "Completed"

    # Every resume point was a good checkpoint (S3: its manifest verifies; memory: recorded good),
    # strictly later each time.
    import json

    s3_env = json.loads((cp.home / "devstack" / "s3.json").read_text())
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env["endpoint_url"])
    monkeypatch.setenv("AERIE_S3_ENDPOINT", s3_env["endpoint_url"])
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    resumed = [a["resumed_step"] for a in attempts[1:]]
    assert all(step and step > 0 for step in resumed), resumed
    assert resumed == sorted(resumed)
    rows = {c["uri"]: c for c in cp.get(f"/v1/jobs/{job['id']}/checkpoints")}
    for a in attempts[1:]:
        if tier_of_uri(a["resume_from"]) == CheckpointTier.MEMORY:  # in place: the nodes' memory copy
            # Recorded complete (good when it was taken); by the job's end every memory row has
            # expired (`deleted`, with why): only an incomplete or bad one could never be a resume point.
            row = rows.get(a["resume_from"]) or {}
            assert row.get("state") in ("good", "deleted"), (a["resume_from"], row)
            assert row.get("reason") != MEMORY_GONE_ATTEMPT_ENDED, (a["resume_from"], row)
            continue
        v = verify(a["resume_from"])
        assert v.good, (a["resume_from"], v.reasons)
    modes = {a["cause"][CAUSE_MODE] for a in attempts[1:]}
    assert modes == {RestartMode.IN_PLACE, RestartMode.RELAUNCH}, modes  # issue 24: both kinds of restart

    # The stitched loss curve (each step as trained by the last attempt that trained it) equals the
    # uninterrupted run's at every step; every attempt after the first trained steps past its resume point.
    reference = result.reference
    assert max(reference) == STEPS
    stitched: dict[int, float] = {}
    for a in attempts:
        mine = result.losses[a["number"]]
        start = a["resumed_step"] or 0
        after = {s: loss for s, loss in mine.items() if s > start}
        assert after, f"attempt {a['number']} trained no step"
        stitched = {s: loss for s, loss in stitched.items() if s <= start}
        stitched.update(after)
    assert sorted(stitched) == list(range(1, STEPS + 1))
    mismatched = {s: (loss, reference[s]) for s, loss in stitched.items() if loss != reference[s]}
    assert not mismatched, f"diverged from the uninterrupted run: {dict(list(mismatched.items())[:5])}"

    # The outbox kept every state change across the control-plane restart: one Running per attempt.
    events = cp.events("chaos")
    running = [
        e for e in events if e["detail-type"] == "Aerie Attempt State Change" and e["detail"]["state"] == "Running"
    ]
    assert len(running) == len(attempts)

    check_chaos_ledger(cp, job, TRAINER_FAULTS, EXPECTED_REASONS)  # issue 24: the goodput ledger of this run
