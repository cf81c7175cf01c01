"""Acceptance 5 of issue #37: a job with `MaxRuntimeInSeconds: 30` on the local and on the Slurm
backend ends Stopped with `MaxRuntimeExceeded` in its SecondaryStatusTransitions, as SageMaker
reports it, and its last checkpoint is good.

Submitted as a SageMaker user would (boto3's CreateTrainingJob against a real `aerie up`, the
backend picked by the `aerie:backend` tag), the tiny trainer with far more steps than 30 s allow,
checkpointing every few steps to the loopback S3 server; read back through DescribeTrainingJob,
Aerie's own API and `aerie describe`. The control plane's limit (orchestrator/stopping.py) stops it
as StopTrainingJob does: SIGTERM, the save in flight commits or is never recorded.
"""

from __future__ import annotations

import time

import pytest

from aerie_checkpoint.manifest import verify
from devtools.harness.control_plane import ControlPlane
from tests.helpers.sagemaker import aws_keys, client, request

MAX_RUNTIME_S = 30
# From the limit running out to the job's end: a reconcile pass, the stop's SIGTERM grace and the
# backend's teardown (scancel on Slurm); generous for a loaded host.
STOP_WITHIN_S = 120

# Not timing-sensitive (no detector threshold is tight, nothing asserted to the second), and on
# Slurm it names no node: beside the unit tests, as the neighbouring fault-free trainer runs.
pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]


@pytest.fixture
def plane(request, tmp_path, s3_env):
    """A started control plane with the loopback S3 server, and the Slurm cluster for `slurm`."""
    backend = request.param
    extra = {**s3_env, "OMP_NUM_THREADS": "1"}
    if backend == "slurm":
        extra |= request.getfixturevalue("slurm_cluster")
    cp = ControlPlane(tmp_path / "home", extra_env=extra)
    cp.home.mkdir()
    cp.start()
    try:
        yield cp, backend
    finally:
        cp.stop()
        if backend == "slurm":
            import json
            import subprocess

            for handle in (cp.home / "jobs").glob("*/attempt-*/handle.json"):
                subprocess.run(["scancel", str(json.loads(handle.read_text())["slurm_job_id"])], capture_output=True)
        cp.cleanup_nodes()


@pytest.mark.parametrize("plane", ["local", "slurm"], indirect=True)
def test_max_runtime_stops_the_job_as_sagemaker_does_and_its_last_checkpoint_is_good(plane, s3_bucket):
    cp, backend = plane
    name = f"max-runtime-{backend}"
    sm = client("sagemaker", cp.url, aws_keys(cp.url, cp.token))
    body = request(
        name,
        HyperParameters={
            "steps": "1000000",  # never reached: only the limit ends it
            "eval_every": "1000000",
            "seq_len": "32",
            # Every step: on a loaded host the ranks' start (torch's import) can take most of the 30 s.
            "checkpoint.every_steps": "1",
        },
        OutputDataConfig={"S3OutputPath": f"s3://{s3_bucket}/output"},
        CheckpointConfig={"S3Uri": f"s3://{s3_bucket}/checkpoints"},
        StoppingCondition={"MaxRuntimeInSeconds": MAX_RUNTIME_S},
        Tags=[{"Key": "aerie:backend", "Value": backend}],
    )
    sm.create_training_job(**body)

    deadline = time.time() + 300
    while (d := sm.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] not in (
        "Completed",
        "Failed",
        "Stopped",
    ):
        assert time.time() < deadline, d["SecondaryStatusTransitions"]
        time.sleep(1)
    transitions = d["SecondaryStatusTransitions"]
    story = [(t["Status"], t["StatusMessage"][:120]) for t in transitions]
    assert d["TrainingJobStatus"] == "Stopped", (d.get("FailureReason"), story)
    assert d["SecondaryStatus"] == "MaxRuntimeExceeded", story
    assert [t["Status"] for t in transitions][-2:] == ["Stopping", "MaxRuntimeExceeded"], story
    assert transitions[-1]["StatusMessage"] == "Training job runtime exceeded MaxRuntimeInSeconds provided"
    # It trained at least the limit and was stopped soon after (not Slurm's --time, not 1000000 steps).
    assert MAX_RUNTIME_S <= d["TrainingTimeInSeconds"] <= MAX_RUNTIME_S + STOP_WITHIN_S, d["TrainingTimeInSeconds"]
    assert "FailureReason" not in d

    job = cp.job(name)
    assert job["state"] == "Stopped" and job["reason"]["kind"] == "stopping.max_runtime", job["reason"]
    assert job["reason"]["evidence"]["max_runtime_s"] == MAX_RUNTIME_S
    attempts = [(a["state"], (a.get("reason") or {}).get("kind")) for a in job["attempt_list"]]
    assert attempts == [("Stopped", "stopping.max_runtime")], job["attempt_list"]
    described = cp.cli("describe", name, check=True).stdout
    assert "stopping.max_runtime" in described and "MaxRuntimeInSeconds" in described, described

    # The last checkpoint is good: recorded good, and every object re-read against its checksum.
    listed = cp.get(f"/v1/jobs/{job['id']}/checkpoints")
    assert isinstance(listed, list)
    checkpoints = [c for c in listed if c.get("tier", "s3") == "s3"]  # the durable tier (memory's ends with the job)
    assert checkpoints, f"no checkpoint was committed in {MAX_RUNTIME_S} s of training: {listed}"
    newest = max(checkpoints, key=lambda c: c["step"])
    assert newest["state"] == "good", checkpoints
    check = verify(newest["uri"], deep=True)
    assert check.good, check.reasons
