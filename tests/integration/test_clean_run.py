"""False positives: a clean 10-minute run raises no verdict.

The tiny trainer on 2 local nodes x 2 processes for `AERIE_CLEAN_RUN_S` seconds (default 600)
with the spec's *default* health thresholds, asynchronous checkpoints to the loopback S3 server
every 75 steps (about every 40-50 s) and an evaluation pause every 125 steps (about every 70 s).
Pre-flight is on (`health.preflight`, its default thresholds) and one hot spare waits
(`resources.spare_nodes: 1`, issue #23 acceptance 5): both nodes' pre-flight results are recorded,
the spare (algo-3) runs its own and waits without ranks the whole run, and neither raises a
verdict. Then the job is stopped: it must end Stopped — not Failed — with no verdict on any node.
In `make test` it runs beside the serial whole-job tests (marker `beside_serial`), not alone.

Each step of every rank also waits `STEP_WAIT_S`, as a rank on a GPU node waits on its device (the
trainer's `slow` fault with no rank: every rank alike, so no straggler either). Without it the four
ranks kept both of this machine's cores busy for the whole ten minutes, and the tests beside them
ran on what was left: most of that `make test` phase was this run's CPU, not its length.
Half a second (a GPU step of a small model) rather than a quarter: the four ranks' CPU beside the
other tests halves again (measured: ~0.1 core a rank at a quarter second), still ~1,000 steps.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from devtools.harness.jobs import rank_losses, trainer_spec

RUN_S = float(os.environ.get("AERIE_CLEAN_RUN_S", "600"))
STEP_WAIT_S = 0.5

# Beside the serial tests: `make test` runs it in a pytest process of its own while another runs
# whole jobs with faults one after another (kills, hangs, NaNs, a paused S3 server, Slurm), so the
# host is busy as a real node's host often is, and no verdict may follow.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.beside_serial,
    pytest.mark.timeout(RUN_S + 600),
]


def test_clean_long_run_raises_no_verdict(s3_plane, tmp_path):
    cp = s3_plane
    spec = trainer_spec(
        tmp_path / "clean.json",
        "clean-run",
        # Never done before RUN_S (each step sleeps STEP_WAIT_S), and no more: rank 0 builds the
        # dataset's sample index for every step up front, and for 10**7 steps that took a core for
        # minutes and ~10 GB of memory before the first step.
        steps=int(RUN_S / STEP_WAIT_S) + 1,
        checkpoint_uri="s3://aerie/clean",
        every_steps=75,
        extra_hps={"eval_every": "125", "eval_iters": "40"},
        faults=[{"kind": "slow", "step": 1, "seconds": STEP_WAIT_S}],
        spare_nodes=1,
        max_restarts=1,  # spares wait only where a failed node's slot can be handed over in place
    )
    # The spec's default thresholds, not the tight ones trainer_spec uses for fault tests; pre-flight on.
    data = json.loads(spec.read_text())
    data["health"] = {"preflight": {"enabled": True}}
    spec.write_text(json.dumps(data))
    cp.cli("submit", str(spec), check=True)
    started = time.time()
    while time.time() - started < RUN_S:
        job = cp.job("clean-run")
        assert job["state"] in ("Submitted", "InProgress"), (job["state"], job.get("reason"), job["verdicts"])
        assert not job["verdicts"], job["verdicts"]
        time.sleep(5)
    cp.cli("stop", "clean-run", check=True)
    job = cp.wait_state("clean-run", {"Stopped", "Failed", "Completed"}, timeout_s=120)
    assert job["state"] == "Stopped", job
    assert job["verdicts"] == []
    assert len(job["attempt_list"]) == 1
    (attempt,) = job["attempt_list"]
    assert sorted(n["host"] for n in attempt["nodes"]) == ["algo-1", "algo-2"], attempt["nodes"]
    assert all(n["preflight"] and n["preflight"]["passed"] for n in attempt["nodes"]), attempt["nodes"]
    # The spare checked itself, then waited: never a rank, still the attempt's spare at the end.
    assert attempt["spares"] == ["algo-3"], attempt
    assert attempt["spare_preflight"]["algo-3"]["passed"], attempt["spare_preflight"]
    spare = cp.home / "jobs" / job["id"] / "attempt-1" / "algo-3"
    assert not list((spare / "agent" / "ranks").glob("rank-*.pid"))
    assert "is a hot spare" in (spare / "logs" / "node.log").read_text(errors="replace")
    assert json.loads((spare / "agent" / "preflight.json").read_text())["passed"]
    checkpoints = cp.get("/v1/jobs/clean-run/checkpoints")
    assert len(checkpoints) >= 2, checkpoints
    events = [
        line
        for p in (cp.home / "jobs").glob("clean-run-*/attempt-1/algo-1/output/metrics/rank-00000.jsonl")
        for line in p.read_text().splitlines()
        if '"eval_end"' in line
    ]
    assert events, "the run must have paused for at least one evaluation"
    assert max(rank_losses(cp.home / "jobs", job["id"])[1]) > 600
