"""Acceptance: SageMaker's own failure event drives chaining to a resumed attempt 2 on SageMaker.

Real parts: the API over HTTP (uvicorn in this process) on a real SQLite store, the loopback S3
server holding a committed checkpoint, `lambdas.chain_restart` invoked as AWS Lambda would (the
EventBridge event + a context), and the controller launching attempt 2 through the sagemaker
backend. AWS itself cannot be reached here, so the SageMaker client is botocore's `Stubber`,
which checks the CreateTrainingJob request against the real service model.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.stub import ANY, Stubber

from lambdas import chain_restart
from orchestrator.backends.sagemaker import SageMakerBackend
from orchestrator.controller import Controller
from orchestrator.events import LambdaContext
from orchestrator.settings import Settings
from orchestrator.store import repo

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "sagemaker"


@pytest.fixture
def api(live_api):
    """The live API over HTTP (here, not the in-process client of tests/orchestrator/conftest.py)."""
    return live_api


def _job_with_failed_first_attempt(api, checkpoints: str) -> str:
    spec = yaml.safe_load((REPO / "examples" / "pythia-tiny-sagemaker.yaml").read_text())
    spec["checkpoint"]["s3_uri"] = checkpoints
    with api.db.session() as s:
        job = repo.create_job(s, spec, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        attempt.handle = {"training_job_name": f"{job.id}-a1", "hosts": ["algo-1", "algo-2"]}
        return job.id


def _sagemaker_event(job_id: str) -> dict:
    event = json.loads((DATA / "eventbridge_training_job_failed.json").read_text())
    text = json.dumps(event).replace("pythia-tiny-sm-0a1b2c", job_id)
    return json.loads(text)


def test_sagemaker_failure_event_chains_to_a_resumed_create_training_job(api, s3_bucket):
    from aerie_checkpoint.manifest import commit

    checkpoints = f"s3://{s3_bucket}/checkpoints"
    job_id = _job_with_failed_first_attempt(api, checkpoints)
    good = f"{checkpoints}/{job_id}/step_00000300/attempt_0001"
    boto3.client("s3").put_object(
        Bucket=s3_bucket, Key=f"checkpoints/{job_id}/step_00000300/attempt_0001/__0_0.distcp", Body=b"x" * 64
    )
    commit(good, step=300, tokens=300 * 4096, attempt=1)
    with api.db.session() as s:  # recorded while attempt 1 ran, as its trainer's commit is
        repo.record_checkpoint(s, repo.get_attempt(s, f"{job_id}-a1"), 300, good, {"size_bytes": 64})

    # The controller records attempt 1's failure from DescribeTrainingJob (as its poll would) ...
    with api.db.session() as s:
        attempt = repo.get_attempt(s, f"{job_id}-a1")
        repo.set_attempt_state(s, attempt, "Failed", {"kind": "silent.hang", "message": "no new step"}, 1)
    # ... and SageMaker's own event for it reaches chain_restart exactly as EventBridge delivers it.
    context = LambdaContext(function_name="chain_restart", aerie_api=api.url, aerie_token=api.service)
    result = chain_restart.handler(_sagemaker_event(job_id), context)
    assert result["action"] == "restart" and result["attempt"] == 2 and result["resume_from"] == good, result
    # Delivered again (EventBridge is at-least-once): no second attempt.
    assert chain_restart.handler(_sagemaker_event(job_id), context)["action"] == "none"

    client = boto3.client("sagemaker", region_name="us-east-1")
    backend = SageMakerBackend(client=client, region="us-east-1")
    controller = Controller(api.db, Settings(), {"sagemaker": backend})
    with Stubber(client) as stub:
        # A relaunch first ends the failed attempt's training job (its agents might wait in place);
        # SageMaker refuses for one that already ended, which the backend takes as done.
        stub.add_client_error("stop_training_job", "ValidationException", "The job status is Failed")
        stub.add_response(
            "create_training_job",
            {"TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{job_id}-a2"},
            {
                **{
                    k: ANY
                    for k in (
                        "RoleArn",
                        "AlgorithmSpecification",
                        "OutputDataConfig",
                        "ResourceConfig",
                        "StoppingCondition",
                        "HyperParameters",
                        "InputDataConfig",
                        "Tags",
                        "VpcConfig",
                        "EnableNetworkIsolation",
                        "EnableInterContainerTrafficEncryption",
                        "Environment",
                    )
                },
                "TrainingJobName": f"{job_id}-a2",
            },
        )
        sent: dict = {}
        client.meta.events.register(
            "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: sent.update(params)
        )
        controller.reconcile_once()
        stub.assert_no_pending_responses()
    env = sent["Environment"]
    assert env["AERIE_RESUME_FROM"] == good
    assert "CheckpointConfig" not in sent  # the restore streams from S3; SageMaker stages nothing
    assert env["AERIE_ATTEMPT"] == f"{job_id}-a2" and env["AERIE_ATTEMPT_NUMBER"] == "2"
    assert env["AERIE_CHECKPOINT_URI"] == f"{checkpoints}/{job_id}"
    assert env["AERIE_AGENT_TOKEN"] and "RetryStrategy" not in sent
    with api.db.session() as s:
        second = repo.get_attempt(s, f"{job_id}-a2")
        assert second.state == "Running" and second.handle["training_job_name"] == f"{job_id}-a2"
