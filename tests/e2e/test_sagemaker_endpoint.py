"""The SageMaker-compatible endpoint end to end: a real `aerie up` on the local backend, real boto3
clients and the real SageMaker Python SDK 3.x, signing with credentials from
`aerie token create --aws`; the tiny trainer really runs, on 2 local nodes.

AWS's own services cannot be reached from here: the dev stack's loopback moto server stands in for
them (S3 for checkpoints, the SDK's staged code and the model artifacts; STS and IAM for the SDK's
calls), reached through an ordinary AWS profile whose `sagemaker` and `cloudwatch_logs` endpoints
are Aerie (tests/helpers/sagemaker.py: `aws_profile`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import boto3
import pytest
from botocore.exceptions import ClientError

from devtools.harness.control_plane import REPO, ControlPlane
from devtools.harness.jobs import FAST_HEALTH
from tests.helpers.sagemaker import ROLE, aws_profile, client, request

GROUP = "/aws/sagemaker/TrainingJobs"
WAIT = {"Delay": 1, "MaxAttempts": 300}


@pytest.fixture(scope="module")
def cp(tmp_path_factory):
    home = tmp_path_factory.mktemp("sagemaker-e2e") / "home"
    home.mkdir()
    plane = ControlPlane(home, s3=True).start()
    yield plane
    plane.stop()
    plane.cleanup_nodes()


def _credentials(cp, *args: str) -> tuple[str, tuple[str, str]]:
    """`aerie token create --aws` as a user runs it: its output and the keys in it."""
    out = cp.cli("token", "create", "--aws", *args, check=True).stdout
    values = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line and not line.startswith("#"))
    return out, (values["aws_access_key_id"], values["aws_secret_access_key"])


@pytest.fixture(scope="module")
def creds(cp):
    return _credentials(cp, "--role", "member")


@pytest.fixture(scope="module")
def moto_url(cp):
    return json.loads((cp.home / "devstack" / "s3.json").read_text())["endpoint_url"]


def tiny(name: str, steps: int, count: int = 2, **overrides) -> dict:
    """CreateTrainingJob for the tiny trainer on `count` instances, health thresholds for tests."""
    body = request(
        name,
        HyperParameters={"steps": str(steps), "eval_every": "1000000", "seq_len": "64"},
        ResourceConfig={"InstanceType": "ml.c5.xlarge", "InstanceCount": count, "VolumeSizeInGB": 10},
        Tags=[{"Key": "aerie:health", "Value": json.dumps(FAST_HEALTH)}],
    )
    body["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "train:loss", "Regex": r"loss ([0-9.]+)"}]
    body.update(overrides)
    return body


def standin(service: str, url: str):
    """A client of the stand-in for AWS's own services (moto accepts any credentials)."""
    return boto3.client(
        service, endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def statuses(described: dict) -> list[str]:
    return [t["Status"] for t in described["SecondaryStatusTransitions"]]


# Not timing-sensitive: `make test` runs it with the unit tests, on two workers (tests/conftest.py)
# (no fault; the SDK's test below, whose fault is an exit, joins it; the hang test stays serial).
@pytest.mark.side_by_side
def test_boto3_runs_waits_lists_and_stops_training_jobs(cp, creds, moto_url, monkeypatch):
    """Acceptance 1: create -> the waiter until Completed -> list -> stop a second job; wrong keys,
    a bad signature and a stale date are refused with AWS's codes; another tenant sees nothing."""
    sm = client("sagemaker", cp.url, creds[1])
    arn = sm.create_training_job(**tiny("sm-clean", steps=6))["TrainingJobArn"]
    sm.get_waiter("training_job_completed_or_stopped").wait(TrainingJobName="sm-clean", WaiterConfig=WAIT)
    d = sm.describe_training_job(TrainingJobName="sm-clean")
    assert d["TrainingJobArn"] == arn
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("Completed", "Completed"), d.get("FailureReason")
    assert statuses(d) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert [m["MetricName"] for m in d["FinalMetricDataList"]] == ["train:loss"]
    assert 0 < d["FinalMetricDataList"][0]["Value"] < 10
    assert d["BillableTimeInSeconds"] >= d["TrainingTimeInSeconds"] > 0
    artifacts = d["ModelArtifacts"]["S3ModelArtifacts"]
    assert artifacts == "s3://aerie/output/sm-clean/output/model.tar.gz"
    s3 = standin("s3", moto_url)
    assert s3.head_object(Bucket="aerie", Key="output/sm-clean/output/model.tar.gz")["ContentLength"] > 0
    # It is an ordinary Aerie job too: one attempt of 2 nodes on the local backend.
    job = cp.job("sm-clean")
    assert job["state"] == "Completed" and job["backend"] == "local"
    assert [n["host"] for n in job["attempt_list"][0]["nodes"]] == ["algo-1", "algo-2"]
    # Its output, as the SDKs read it: one CloudWatch stream per instance.
    logs = client("logs", cp.url, creds[1])
    streams = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix="sm-clean/")["logStreams"]
    assert len(streams) == 2
    events = logs.get_log_events(logGroupName=GROUP, logStreamName=streams[0]["logStreamName"], startFromHead=True)
    assert any("step 6/6 loss" in e["message"] for e in events["events"])

    # A second job, stopped while it trains.
    sm.create_training_job(**tiny("sm-stop", steps=100000, count=1))
    deadline = time.time() + 120
    while sm.describe_training_job(TrainingJobName="sm-stop")["SecondaryStatus"] != "Training":
        assert time.time() < deadline, "sm-stop never started training"
        time.sleep(0.5)
    sm.stop_training_job(TrainingJobName="sm-stop")
    assert sm.describe_training_job(TrainingJobName="sm-stop")["TrainingJobStatus"] in ("Stopping", "Stopped")
    sm.get_waiter("training_job_completed_or_stopped").wait(TrainingJobName="sm-stop", WaiterConfig=WAIT)
    d = sm.describe_training_job(TrainingJobName="sm-stop")
    assert d["TrainingJobStatus"] == "Stopped" and statuses(d)[-2:] == ["Stopping", "Stopped"]
    assert "FailureReason" not in d

    listed = sm.list_training_jobs(SortBy="Name")["TrainingJobSummaries"]
    assert [(j["TrainingJobName"], j["TrainingJobStatus"]) for j in listed] == [
        ("sm-clean", "Completed"),
        ("sm-stop", "Stopped"),
    ]
    assert [j["TrainingJobName"] for j in sm.list_training_jobs(StatusEquals="Stopped")["TrainingJobSummaries"]] == [
        "sm-stop"
    ]

    def refused(sm_client) -> str:
        with pytest.raises(ClientError) as err:
            sm_client.describe_training_job(TrainingJobName="sm-clean")
        return err.value.response["Error"]["Code"]

    assert refused(client("sagemaker", cp.url, ("AKIAAAAAAAAAAAAAAAAA", creds[1][1]))) == "UnrecognizedClientException"
    assert refused(client("sagemaker", cp.url, (creds[1][0], "wrong" * 8))) == "InvalidSignatureException"
    import botocore.auth

    real_now = botocore.auth.get_current_datetime
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: real_now() - timedelta(minutes=20))
    assert refused(client("sagemaker", cp.url, creds[1])) == "InvalidSignatureException"  # "Signature expired"
    monkeypatch.setattr(botocore.auth, "get_current_datetime", real_now)
    other = client("sagemaker", cp.url, _credentials(cp, "--role", "admin", "--tenant", "other-team")[1])
    assert other.list_training_jobs()["TrainingJobSummaries"] == []
    assert refused(other) == "ValidationException"  # "Requested resource not found."
    with pytest.raises(ClientError):
        other.stop_training_job(TrainingJobName="sm-clean")


@pytest.mark.slow
def test_a_silent_hang_in_a_boto3_job_is_caught_and_restarted(cp, creds):
    """Acceptance 4: a busy hang injected into a job submitted through boto3 is caught by the agent,
    the job restarts from its last good checkpoint and completes; SecondaryStatusTransitions show it."""
    sm = client("sagemaker", cp.url, creds[1])
    body = tiny(
        "sm-hang",
        steps=14,
        Environment={"AERIE_FAULTS": json.dumps([{"kind": "busy_hang", "step": 10, "rank": 1}])},
        CheckpointConfig={"S3Uri": "s3://aerie/sm-checkpoints"},
        RetryStrategy={"MaximumRetryAttempts": 1},
    )
    body["HyperParameters"]["checkpoint.every_steps"] = "4"
    sm.create_training_job(**body)
    sm.get_waiter("training_job_completed_or_stopped").wait(TrainingJobName="sm-hang", WaiterConfig=WAIT)
    d = sm.describe_training_job(TrainingJobName="sm-hang")
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert statuses(d) == [
        "Starting",
        "Downloading",
        "Training",
        "Restarting",
        "Training",
        "Uploading",
        "Completed",
    ]
    restart = d["SecondaryStatusTransitions"][3]["StatusMessage"]
    assert "silent.hang" in restart and "resumes from step 8" in restart, restart
    job = cp.job("sm-hang")
    assert [a["state"] for a in job["attempt_list"]] == ["Failed", "Completed"]
    assert job["attempt_list"][0]["reason"]["kind"] == "silent.hang"


# Side by side as well: its fault is a SIGKILL (an exit, not a hang), and what the watcher records is
# each job's whole status history, so no short window has to be caught.
@pytest.mark.slow
@pytest.mark.side_by_side
def test_the_sagemaker_sdk_trains_on_aerie_unchanged(cp, creds, moto_url, tmp_path):
    """Acceptance 3: `ModelTrainer(...).train(wait=True)` of the SageMaker Python SDK 3.x, with a
    custom image, a command, 2 instances and a session on a boto3 session: its first attempt is
    killed, the job shows InProgress while Aerie restarts it, and train() returns at Completed with
    the job's output printed from CloudWatch Logs (logs=True)."""
    out, keys = creds
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AERIE_", "SAGEMAKER_"))}
    env.update(aws_profile(tmp_path / "aws", out, cp.url, moto_url))
    env.update(HOME=str(tmp_path), COLUMNS="200")
    iam = standin("iam", moto_url)
    trust = {"Statement": [{"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}]}
    iam.create_role(RoleName=ROLE.rsplit("/", 1)[1], AssumeRolePolicyDocument=json.dumps(trust))
    settings = {
        "role": ROLE,
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie-trainer:1",
        "base_job_name": "sdk-tiny",
        "command": "python -m trainer.train --config examples/configs/pythia-tiny.yaml --set checkpoint.every_steps=3",
        "hyperparameters": {"steps": 12, "eval_every": 1000000, "seq_len": 64},
        "environment": {"AERIE_FAULTS": json.dumps([{"kind": "sigkill", "step": 10, "rank": 1}])},
        "checkpoint_s3_uri": "s3://aerie/sdk-checkpoints",
        "tags": {"aerie:health": json.dumps(FAST_HEALTH)},
        "retries": 1,
        "bucket": "aerie",
    }
    seen: list[tuple[str, tuple[str, ...]]] = []
    done = threading.Event()
    sm = client("sagemaker", cp.url, keys)

    def watch() -> None:  # what any other boto3 user sees while the SDK waits
        while not done.is_set():
            for job in sm.list_training_jobs(NameContains="sdk-tiny")["TrainingJobSummaries"]:
                d = sm.describe_training_job(TrainingJobName=job["TrainingJobName"])
                seen.append((d["TrainingJobStatus"], tuple(statuses(d))))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = subprocess.run(
            [sys.executable, "tests/e2e/sagemaker_sdk_train.py", json.dumps(settings)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
        )
    finally:
        done.set()
        watcher.join(timeout=30)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    name = r.stdout.strip().splitlines()[-1].removeprefix("TRAINING_JOB_NAME=")
    # logs=True: both instances' output, read through Aerie's CloudWatch Logs calls.
    assert f"{name}/algo-1-" in r.stdout and f"{name}/algo-2-" in r.stdout
    assert "[algo-1 rank 0] step 12/12 loss" in r.stdout
    d = sm.describe_training_job(TrainingJobName=name)
    assert d["TrainingJobStatus"] == "Completed" and statuses(d).count("Training") == 2
    assert "Restarting" in statuses(d) and d["FinalMetricDataList"][0]["MetricName"] == "train:loss"
    restart = d["SecondaryStatusTransitions"][statuses(d).index("Restarting")]["StatusMessage"]
    assert "exit.nonzero" in restart and "resumes from step" in restart and "(no checkpoint" not in restart
    # While Aerie restarted it, the job was InProgress, never Failed.
    assert any(status == "InProgress" and "Restarting" in steps for status, steps in seen), seen[-5:]
    assert all(status != "Failed" for status, _ in seen)
    assert d["AlgorithmSpecification"]["ContainerEntrypoint"] == ["/bin/bash"]  # the SDK's own driver ran
