"""Acceptance 4 of issue #19, end to end: NaN attribution by replay on real jobs.

One control plane (with its loopback S3 server, checkpoints every 5 steps) runs two jobs of the
tiny trainer at once, 2 nodes x 1 process each (the fewest that can tell one node from another),
both poisoned at step 12 by the `nan` fault:

- `nan-recurs`: the NaN comes back at step 12 in attempt 2 too (two faults, `attempt` 1 and 2),
  as a NaN of the data or the model does after a deterministic resume from step 10. Chaining
  stops the job as a user error naming the step and the samples it read; `aerie describe` says so.
- `nan-sdc`: only rank 1 (node algo-2) turns NaN, only in attempt 1 (a fault's default attempt).
  Attempt 2 replays step 12 with a finite loss, so the controller records `sdc.suspect` against
  algo-2 on attempt 1 and blames algo-2; attempt 2 runs on to the end.

The NaN is the fault injector's (trainer/faults.py), a stand-in for a faulty GPU or a bad batch:
neither can be made on demand on a CPU. The controller-level cases are in
tests/orchestrator/test_nan_replay.py and tests/lambdas/test_chain_restart.py.
"""

from __future__ import annotations

import time

import pytest

from aerie_contracts import FailureKind
from devtools.harness.jobs import trainer_spec

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

NAN_STEP = 12
EVERY = 5
TERMINAL = {"Completed", "Failed", "Stopped"}


def test_a_recurring_nan_is_a_user_error_and_a_one_off_nan_blames_its_node(s3_plane, tmp_path):
    cp = s3_plane
    recurs = trainer_spec(
        tmp_path / "recurs.json",
        "nan-recurs",
        steps=30,
        procs=1,
        faults=[{"kind": "nan", "step": NAN_STEP, "attempt": n} for n in (1, 2)],
        checkpoint_uri="s3://aerie/nan-recurs",
        every_steps=EVERY,
        max_restarts=2,  # budget left: the user error, not the budget, must stop it
    )
    sdc = trainer_spec(
        tmp_path / "sdc.json",
        "nan-sdc",
        steps=60,
        procs=1,
        faults=[{"kind": "nan", "step": NAN_STEP, "rank": 1}],
        checkpoint_uri="s3://aerie/nan-sdc",
        every_steps=EVERY,
        max_restarts=1,
    )
    started = time.time()
    cp.cli("submit", str(recurs), check=True)
    cp.cli("submit", str(sdc), check=True)

    job = cp.wait_state("nan-recurs", TERMINAL, timeout_s=240)
    print(f"nan-recurs {job['state']} after {time.time() - started:.1f}s")
    assert job["state"] == "Failed", job
    assert [a["reason"]["kind"] for a in job["attempt_list"]] == [FailureKind.LOSS_NAN] * 2, job["attempt_list"]
    assert job["attempt_list"][1]["resume_from"], job["attempt_list"][1]  # a real resume, from step 10
    why = job["reason"]
    assert why["kind"] == FailureKind.USER_ERROR and why["step"] == NAN_STEP, why
    assert why["data_index"] and why["data_index"][1] > why["data_index"][0], why
    assert not job["blames"], job["blames"]  # the data's NaN blames no node
    described = cp.cli("describe", "nan-recurs", check=True).stdout
    assert f"loss.nan recurs at step {NAN_STEP}" in described, described

    job = cp.wait_state("nan-sdc", TERMINAL, timeout_s=240)
    print(f"nan-sdc {job['state']} after {time.time() - started:.1f}s")
    story = [(a["number"], a["state"], a.get("reason"), a.get("resume_from")) for a in job["attempt_list"]]
    assert job["state"] == "Completed", f"{story!s:.2000} | verdicts {job.get('verdicts')!s:.1500}"
    first, second = job["attempt_list"]
    assert first["reason"]["kind"] == FailureKind.LOSS_NAN and second["resume_from"], job["attempt_list"]
    (suspect,) = [v for v in job["verdicts"] if v["kind"] == FailureKind.SDC_SUSPECT]
    assert suspect["attempt_id"] == first["id"] and suspect["host"] == "algo-2", suspect
    ev = suspect["evidence"]
    assert ev["step"] == NAN_STEP and ev["rank"] == "1" and ev["replay"] == "did not recur", ev
    blamed = [(b["host"], b["kind"]) for b in job["blames"]]
    assert blamed == [("algo-2", FailureKind.SDC_SUSPECT)], job["blames"]
    described = cp.cli("describe", "nan-sdc", check=True).stdout
    assert "sdc.suspect" in described and "algo-2" in described, described
