"""Crash safety of the control plane: SIGKILL at the worst moments, then a restart.

Failpoints (`AERIE_FAILPOINT`, orchestrator/failpoints.py) make the real `aerie up` process kill
itself with SIGKILL at a named line: while launching an attempt, right after a handler ran but
before its event was marked delivered, and in the middle of a checkpoint-GC deletion. After a
restart no job is lost, no attempt is launched twice, no event is lost, nothing is deleted that
should stay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from aerie_checkpoint.manifest import checkpoint_uri, list_checkpoints, verify
from devtools.harness.control_plane import FIRST_ATTEMPT_STORY, REPO, ControlPlane, event_story, write_spec
from orchestrator.settings import Settings
from orchestrator.store import repo
from tests.helpers.gc_jobs import gc_job, s3_checkpoint
from tests.helpers.live_api import start_live_api

# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py):
# contract-check jobs and failpoints; it asserts what ran and what was delivered, no timing.
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

CONTRACT = ["python", "tests/e2e/contract_check.py"]


def _crash_then_restart(tmp_path, failpoint: str, spec: dict) -> ControlPlane:
    home = tmp_path / "home"
    home.mkdir()
    cp = ControlPlane(home, extra_env={"AERIE_FAILPOINT": failpoint}).start()
    cp.cli("submit", str(write_spec(tmp_path / "spec.json", **spec)), check=True)
    assert cp.proc is not None
    cp.proc.wait(timeout=120)  # the failpoint kills it
    assert cp.proc.returncode == -9, "the control plane should have died at the failpoint"
    cp.env.pop("AERIE_FAILPOINT")
    return cp.start()


@pytest.mark.parametrize("failpoint", ["controller.before_launch", "controller.after_launch"])
def test_killed_while_launching_launches_exactly_once(tmp_path, failpoint):
    spec = {
        "name": "launch-crash",
        "entrypoint": CONTRACT,
        "args": ["--steps", "2"],
        "resources": {"instance_count": 2, "procs_per_node": 2},
    }
    cp = _crash_then_restart(tmp_path, failpoint, spec)
    try:
        job = cp.wait_state("launch-crash", {"Completed", "Failed"}, timeout_s=180)
        assert job["state"] == "Completed"
        assert len(job["attempt_list"]) == 1
        assert event_story(cp.events("launch-crash")) == FIRST_ATTEMPT_STORY
        logs = cp.cli("logs", "launch-crash", check=True).stdout
        assert logs.count("contract ok=True") == 4, "every rank ran once, none twice"
    finally:
        cp.stop()
        cp.cleanup_nodes()


def test_killed_after_a_restart_decision_before_marking_it_delivered(tmp_path):
    """The Failed event's handler created attempt 2, then the control plane died before the event
    was marked delivered: it is delivered again after the restart and changes nothing."""
    spec = {
        "name": "deliver-crash",
        "entrypoint": CONTRACT,
        "args": ["--steps", "1", "--exit-code", "3"],
        "resources": {"instance_count": 1, "procs_per_node": 1},
        "retry": {"max_restarts": 1},
    }
    cp = _crash_then_restart(tmp_path, "events.after_deliver:Aerie Attempt State Change:Failed", spec)
    try:
        job = cp.wait_state("deliver-crash", {"Completed", "Failed"}, timeout_s=180)
        assert job["state"] == "Failed"
        assert [a["number"] for a in job["attempt_list"]] == [1, 2]
        story = event_story(cp.events("deliver-crash"))
        assert story.count("attempt 1 Failed") == 1 and story.count("attempt 2 Failed") == 1
        assert story.count("attempt 2 Running") == 1
        # The job's own final event is delivered just after the job turns Failed: give it a moment.
        deadline = time.time() + 30
        statuses = {r["status"] for r in cp.get("/v1/jobs/deliver-crash/events")}
        while statuses != {"delivered"} and time.time() < deadline:
            time.sleep(0.3)
            statuses = {r["status"] for r in cp.get("/v1/jobs/deliver-crash/events")}
        assert statuses == {"delivered"}, "every event delivered after the restart"
    finally:
        cp.stop()
        cp.cleanup_nodes()


def test_killed_in_the_middle_of_checkpoint_gc(aerie_home, s3_env, s3_bucket):
    """SIGKILL after GC deleted a checkpoint's manifest but before its shards: the redelivered
    event finishes the job, and the kept checkpoints (newest, keep_last, resume point) stay good."""
    live = start_live_api(Settings())
    try:
        base = f"s3://{s3_bucket}/ckpt"
        with live.db.session() as s:
            job = gc_job(s, "gc", base, keep_last=1)
            prefix = f"{base}/{job.id}"
            a1 = repo.create_attempt(s, job, 1)
            a2 = None
            # Attempt 1 commits 10 and 20 (recorded while it runs), fails; attempt 2 commits 30, 40.
            for step, number in ((10, 1), (20, 1), (30, 2), (40, 2)):
                if number == 2 and a2 is None:
                    repo.set_attempt_state(s, a1, "Failed", {"kind": "node.lost"})
                    a2 = repo.create_attempt(s, job, 2, resume_from=checkpoint_uri(prefix, 20, 1))
                uri = checkpoint_uri(prefix, step, number)
                s3_checkpoint(uri, step, number, 64)
                repo.record_checkpoint(s, a2 or a1, step, uri, {"size_bytes": 64})
            job_id = job.id
        event = {
            "version": "0",
            "id": "gc-1",
            "detail-type": "Aerie Checkpoint Committed",
            "source": "aerie.orchestrator",
            "detail": {"job_id": job_id, "step": 40, "uri": checkpoint_uri(prefix, 40, 2)},
        }
        run = (
            "import json, sys; from lambdas import checkpoint_gc; "
            "print(json.dumps(checkpoint_gc.handler(json.loads(sys.argv[1]), None)))"
        )
        env = {
            **os.environ,
            "AERIE_API": live.url,
            "AERIE_SERVICE_TOKEN": live.service,
            "AERIE_FAILPOINT": "gc.after_manifest_delete",
        }
        died = subprocess.run([sys.executable, "-c", run, json.dumps(event)], cwd=REPO, env=env, capture_output=True)
        assert died.returncode == -9
        env.pop("AERIE_FAILPOINT")
        again = subprocess.run(
            [sys.executable, "-c", run, json.dumps(event)], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert again.returncode == 0, again.stderr
        assert [c.step for c in list_checkpoints(prefix) if c.good] == [20, 40]
        assert verify(checkpoint_uri(prefix, 40, 2)).good and verify(checkpoint_uri(prefix, 20, 1)).good
        assert not verify(checkpoint_uri(prefix, 10, 1)).good
        with live.db.session() as s:
            states = {c.step: c.state for c in repo.list_checkpoints(s, repo.get_job(s, "default", job_id))}
        assert states == {10: "deleted", 20: "good", 30: "deleted", 40: "good"}
    finally:
        live.stop()
