"""The `sagemaker` backend against SageMaker's and CloudWatch Logs' real service models.

AWS cannot be reached from this project's machines, so every call goes through botocore's
`Stubber`: the client validates each request against the real service model (botocore's own
parameter validation, the same that runs before a real call) and the stubber checks it equals the
expected request and that each scripted answer is shaped like the real service's response.
Golden requests live in tests/data/sagemaker/; regenerate with AERIE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ParamValidationError
from botocore.stub import ANY, Stubber

from aerie_contracts import memckpt
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.sagemaker import SageMakerBackend, event_from_sagemaker
from orchestrator.backends.sagemaker_request import create_training_job_request, training_job_name
from orchestrator.spec import NAME_PATTERN, JobSpec
from tests.helpers.launch_requests import attempt_request

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "sagemaker"
JOB_ID = "pythia-tiny-sm-0a1b2c"
TOKEN = "agent-token-for-tests"


def _client(service: str):
    return boto3.client(service, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")


def _request(spec: JobSpec, number: int = 1, resume_from: str | None = None, job_id: str = JOB_ID) -> LaunchRequest:
    return attempt_request(
        spec, number, job_id, api_url="https://aerie.example.com", agent_token=TOKEN, resume_from=resume_from
    )


def _sagemaker_examples() -> list[Path]:
    paths = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        spec = JobSpec.load(path)
        if spec.backend == "sagemaker":
            paths.append(path)
    return paths


def _golden(name: str, actual: dict) -> dict:
    path = DATA / name
    if os.environ.get("AERIE_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    return json.loads(path.read_text())


def test_there_is_a_sagemaker_example():
    assert [p.name for p in _sagemaker_examples()] == ["pythia-tiny-sagemaker.yaml"]


@pytest.mark.parametrize("example", _sagemaker_examples(), ids=lambda p: p.stem)
def test_create_training_job_of_each_example_is_valid_and_matches_its_golden(example, monkeypatch):
    spec = JobSpec.load(example)
    request = _request(spec)
    body = create_training_job_request(request)
    expected = _golden(f"{example.stem}.create_training_job.json", body)
    assert body == expected

    # The launch turns the in-memory checkpoint tier on (two instances, in-place restarts): its
    # interval and the attempt's replication key (fixed here) join the golden's Environment.
    key = "ab" * 32
    monkeypatch.setattr(memckpt, "new_key", lambda: key)
    launched = {**expected, "Environment": {**expected["Environment"]}}
    launched["Environment"].update({"AERIE_MEMORY_CHECKPOINT_EVERY": "auto", "AERIE_MEMORY_CHECKPOINT_KEY": key})
    assert create_training_job_request(request, memory_key=key) == launched
    client = _client("sagemaker")
    backend = SageMakerBackend(client=client, region="us-east-1")
    with Stubber(client) as stub:
        stub.add_response(
            "create_training_job",
            {"TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB_ID}-a1"},
            launched,
        )
        handle = backend.launch(request)
        stub.assert_no_pending_responses()
    # The agents outlive worker groups (in-place restarts): the attempt's outcome is what they report.
    assert handle == {
        "training_job_name": f"{JOB_ID}-a1",
        "hosts": ["algo-1", "algo-2"],
        "region": "us-east-1",
        "agents_wait": True,
        memckpt.HANDLE_KEY: key,
    }

    # What the golden promises, spelled out.
    assert "RetryStrategy" not in expected  # Aerie chains attempts itself
    algo = expected["AlgorithmSpecification"]
    assert algo["ContainerEntrypoint"] == ["python", "-m", "agent.entrypoint"] and "ContainerArguments" not in algo
    env = expected["Environment"]
    assert json.loads(env["AERIE_ENTRYPOINT"]) == list(spec.entrypoint) + list(spec.args)
    assert env["AERIE_API"] == "https://aerie.example.com" and env["AERIE_AGENT_TOKEN"] == TOKEN
    assert env["AERIE_ATTEMPT"] == f"{JOB_ID}-a1" and env["AERIE_RESUME_FROM"] == ""
    assert env["AERIE_CHECKPOINT_URI"] == f"s3://aerie-checkpoints/checkpoints/{JOB_ID}"
    # Aerie's checkpoints stream from S3: no CheckpointConfig, so SageMaker stages nothing on disk.
    assert "CheckpointConfig" not in expected
    # The rendezvous comes from each node's resourceconfig.json, not from the request.
    assert "AERIE_MASTER_ADDR" not in env and "AERIE_MASTER_PORT" not in env
    assert {"Key": "aerie:attempt", "Value": f"{JOB_ID}-a1"} in expected["Tags"]


def test_sagemaker_sync_only_when_asked_and_never_over_aeries_checkpoints():
    """`checkpoint.sagemaker_sync` turns SageMaker's CheckpointConfig on, for the user's own local
    directory, under a prefix beside Aerie's: SageMaker still never downloads Aerie's checkpoints."""
    data = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml").model_dump(mode="json")
    data["checkpoint"].update(sagemaker_sync=True, local_path="/opt/ml/user-state")
    spec = JobSpec.model_validate(data)
    body = create_training_job_request(_request(spec))
    aerie = body["Environment"]["AERIE_CHECKPOINT_URI"]
    assert body["CheckpointConfig"] == {
        "S3Uri": f"s3://aerie-checkpoints/checkpoints/{JOB_ID}.sagemaker-sync",
        "LocalPath": "/opt/ml/user-state",
    }
    assert not (body["CheckpointConfig"]["S3Uri"] + "/").startswith(aerie + "/")
    client = _client("sagemaker")
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"})
        client.create_training_job(**body)  # valid against the service model
    data["checkpoint"] = {"s3_uri": "s3://b/c", "local_path": "/opt/ml/checkpoints"}
    with pytest.raises(ValueError, match="sagemaker_sync"):
        JobSpec.model_validate(data)
    data["checkpoint"] = {"s3_uri": "s3://b/c"}
    data["backend_options"]["sagemaker"]["CheckpointLocalPath"] = "/opt/ml/checkpoints"
    with pytest.raises(ValueError, match=r"checkpoint\.sagemaker_sync"):
        create_training_job_request(_request(JobSpec.model_validate(data)))


def test_compact_health_means_the_same_to_the_agent():
    """SageMaker gets only the non-default health fields; the agent's defaults fill in the same values."""
    from aerie_contracts.health import HealthSettings as AgentHealth

    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    sent = json.loads(create_training_job_request(_request(spec))["Environment"]["AERIE_HEALTH"])
    assert sent == {"hang_floor_s": 120.0, "startup_grace_s": 300.0}
    agent = AgentHealth.from_dict(sent)
    assert agent.to_dict() == spec.health.model_dump()


def test_botocore_rejects_a_request_the_service_model_forbids():
    """The validation the golden test relies on is real: a wrong type is refused before sending."""
    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    body = create_training_job_request(_request(spec))
    body["ResourceConfig"]["InstanceCount"] = "two"
    client = _client("sagemaker")
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"})
        with pytest.raises(ParamValidationError):
            client.create_training_job(**body)


def test_attempt_two_resumes_with_the_same_checkpoint_uri_and_a_new_name(monkeypatch):
    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    first = create_training_job_request(_request(spec, 1))
    resume = f"s3://aerie-checkpoints/checkpoints/{JOB_ID}/step_00000200"
    monkeypatch.setattr(memckpt, "new_key", lambda: "cd" * 32)  # each attempt's replication key: fixed here
    second = create_training_job_request(_request(spec, 2, resume_from=resume), memory_key="cd" * 32)
    assert second["TrainingJobName"] == f"{JOB_ID}-a2" != first["TrainingJobName"]
    assert second["Environment"]["AERIE_RESUME_FROM"] == resume
    assert second["Environment"]["AERIE_ATTEMPT"] == f"{JOB_ID}-a2"
    assert "CheckpointConfig" not in second and "CheckpointConfig" not in first
    assert second["Environment"]["AERIE_CHECKPOINT_URI"] == first["Environment"]["AERIE_CHECKPOINT_URI"]
    client = _client("sagemaker")
    with Stubber(client) as stub:
        stub.add_response(
            "create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"}, second
        )
        SageMakerBackend(client=client).launch(_request(spec, 2, resume_from=resume))


def test_launch_again_after_a_crash_is_idempotent():
    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    client = _client("sagemaker")
    running = _described("InProgress", "Training", [], Environment={"AERIE_MEMORY_CHECKPOINT_KEY": "ef" * 32})
    with Stubber(client) as stub:
        stub.add_client_error("create_training_job", "ResourceInUse", "Training job names must be unique")
        stub.add_response("describe_training_job", running, {"TrainingJobName": f"{JOB_ID}-a1"})
        handle = SageMakerBackend(client=client).launch(_request(spec))
        stub.assert_no_pending_responses()
    assert handle["training_job_name"] == f"{JOB_ID}-a1"
    # The running job's nodes hold the replication key it was created with, not a new one.
    assert handle[memckpt.HANDLE_KEY] == "ef" * 32


def test_training_job_names_are_unique_per_attempt_and_fit_sagemaker():
    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    long_id = "a" * 50 + "-" + "0123ab"
    for number in (1, 12, 1234):
        name = training_job_name(_request(spec, number, job_id=long_id))
        assert len(name) <= 63 and re.match(NAME_PATTERN, name), name
        assert name.endswith(f"-a{number}")


def test_backend_defaults_fill_role_and_vpc_but_the_spec_wins():
    spec = JobSpec.model_validate(
        {
            "name": "plain",
            "entrypoint": ["python", "-m", "trainer.train"],
            "backend": "sagemaker",
            "output": {"s3_uri": "s3://out/"},
            "resources": {"instance_type": "ml.g5.xlarge"},
        }
    )
    defaults = {
        "RoleArn": "arn:aws:iam::1:role/Default",
        "VpcConfig": {"Subnets": ["subnet-1"], "SecurityGroupIds": ["sg-1"]},
    }
    body = create_training_job_request(_request(spec, job_id="plain-000001"), defaults)
    assert body["RoleArn"] == "arn:aws:iam::1:role/Default" and body["VpcConfig"] == defaults["VpcConfig"]
    spec2 = spec.model_copy(update={"backend_options": {"sagemaker": {"RoleArn": "arn:aws:iam::1:role/Mine"}}})
    assert create_training_job_request(_request(spec2, job_id="plain-000001"), defaults)["RoleArn"].endswith("/Mine")


# --- DescribeTrainingJob -> PollResult ------------------------------------------------------------


def _described(status: str, secondary: str, transitions: list[tuple[str, str]], **extra) -> dict:
    t0 = datetime(2026, 11, 23, 1, 0, tzinfo=timezone.utc)
    body = {
        "TrainingJobName": f"{JOB_ID}-a1",
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB_ID}-a1",
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie/trainer:0.1.0",
            "TrainingInputMode": "File",
        },
        "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": t0,
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "SecondaryStatusTransitions": [{"Status": s, "StartTime": t0, "StatusMessage": m} for s, m in transitions],
    }
    body.update(extra)
    return body


def test_scripted_describe_sequence_yields_the_right_states_and_failure():
    client = _client("sagemaker")
    backend = SageMakerBackend(client=client)
    handle = {"training_job_name": f"{JOB_ID}-a1", "hosts": ["algo-1", "algo-2"]}
    starting = [("Starting", "Preparing the instances for training")]
    downloading = starting + [("Downloading", "Downloading the training image")]
    training = downloading + [("Training", "Training image download completed. Training in progress.")]
    failed = training + [("Failed", "Training job failed")]
    script = [
        _described("InProgress", "Starting", starting),
        _described("InProgress", "Downloading", downloading),
        _described("InProgress", "Training", training),
        _described(
            "Failed",
            "Failed",
            failed,
            FailureReason="AlgorithmError: ExecuteUserScriptError: exit code 137",
            TrainingEndTime=datetime(2026, 11, 23, 2, 0, tzinfo=timezone.utc),
        ),
    ]
    with Stubber(client) as stub:
        for answer in script:
            stub.add_response("describe_training_job", answer, {"TrainingJobName": f"{JOB_ID}-a1"})
        results = [backend.poll(handle) for _ in script]
    assert [r.state for r in results] == ["Starting", "Starting", "Running", "Failed"]
    last = results[-1]
    assert last.terminal and last.exit_code == 137
    assert last.reason["kind"] == "exit.nonzero" and last.reason["signal"] == 9
    assert last.reason["message"] == "AlgorithmError: ExecuteUserScriptError: exit code 137"
    assert [n.host for n in last.nodes] == ["algo-1", "algo-2"] and all(n.state == "Failed" for n in last.nodes)
    assert [t["status"] for t in last.transitions] == ["Starting", "Downloading", "Training", "Failed"]
    assert last.transitions[0]["message"] == "Preparing the instances for training"


@pytest.mark.parametrize(
    "failure, kind",
    [
        ("AlgorithmError: silent.hang: no new step for 312 s (floor 120 s); accelerators idle", "silent.hang"),
        ("ClientError: Please ensure the training image exists", "user.error"),
        ("CapacityError: Unable to provision requested ML compute capacity", "launch.failed"),
        ("InternalServerError: We encountered an internal error", "node.lost"),
    ],
)
def test_failure_reasons_keep_their_cause(failure, kind):
    client = _client("sagemaker")
    with Stubber(client) as stub:
        stub.add_response("describe_training_job", _described("Failed", "Failed", [], FailureReason=failure))
        result = SageMakerBackend(client=client).poll({"training_job_name": f"{JOB_ID}-a1", "hosts": ["algo-1"]})
    assert result.state == "Failed" and result.reason["kind"] == kind and result.reason["message"] == failure


def test_the_agents_failure_line_keeps_rank_exit_code_and_signal():
    """What the agent writes to /opt/ml/output/failure for a killed rank, as SageMaker quotes it."""
    from lambdas.sagemaker_events import failure_reason

    reason, code = failure_reason("AlgorithmError: exit.nonzero: rank 1 exited with code 137 (signal 9)")
    assert code == 137
    assert {k: reason[k] for k in ("kind", "exit_code", "signal", "rank")} == {
        "kind": "exit.nonzero",
        "exit_code": 137,
        "signal": 9,
        "rank": 1,
    }


def test_completed_stopping_and_stopped():
    client = _client("sagemaker")
    handle = {"training_job_name": f"{JOB_ID}-a1", "hosts": ["algo-1"]}
    with Stubber(client) as stub:
        for status, secondary in (("Stopping", "Stopping"), ("Stopped", "Stopped"), ("Completed", "Completed")):
            stub.add_response("describe_training_job", _described(status, secondary, []))
        states = [SageMakerBackend(client=client).poll(handle) for _ in range(3)]
    assert [(r.state, r.exit_code) for r in states] == [("Running", None), ("Stopped", None), ("Completed", 0)]


def test_stop_calls_stop_training_job_and_tolerates_an_ended_job():
    client = _client("sagemaker")
    backend = SageMakerBackend(client=client)
    handle = {"training_job_name": f"{JOB_ID}-a1", "hosts": ["algo-1"]}
    with Stubber(client) as stub:
        stub.add_response("stop_training_job", {}, {"TrainingJobName": f"{JOB_ID}-a1"})
        stub.add_client_error(
            "stop_training_job",
            "ValidationException",
            "The request was rejected because the training job is in status Stopped.",
        )
        backend.stop(handle)
        backend.stop(handle)
        stub.assert_no_pending_responses()


def test_fencing_a_lost_instance_stops_its_training_job():
    """SageMaker owns the instances: fencing one is StopTrainingJob of the attempt's job (its late
    writes are fenced by the store, tests/aerie_checkpoint/test_fence.py)."""
    client = _client("sagemaker")
    handle = {"training_job_name": f"{JOB_ID}-a1", "hosts": ["algo-1", "algo-2"]}
    with Stubber(client) as stub:
        stub.add_response("stop_training_job", {}, {"TrainingJobName": f"{JOB_ID}-a1"})
        SageMakerBackend(client=client).fence(handle, ["algo-2"])
        stub.assert_no_pending_responses()


def test_logs_come_from_each_instance_stream_with_offsets():
    logs = _client("logs")
    backend = SageMakerBackend(client=_client("sagemaker"), logs_client=logs)
    job = f"{JOB_ID}-a1"
    streams = {
        "logStreams": [{"logStreamName": f"{job}/algo-1-1795395901"}, {"logStreamName": f"{job}/algo-2-1795395902"}]
    }
    events = {
        h: {
            "events": [
                {
                    "timestamp": 1795395900000 + i,
                    "message": f"[{h} rank 0] line {i}",
                    "ingestionTime": 1795395900000 + i,
                }
                for i in range(3)
            ],
            "nextForwardToken": "f/1",
            "nextBackwardToken": "b/1",
        }
        for h in ("algo-1", "algo-2")
    }
    with Stubber(logs) as stub:
        stub.add_response(
            "describe_log_streams",
            streams,
            {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamNamePrefix": job + "/"},
        )
        for h in ("algo-1", "algo-2"):
            stub.add_response(
                "get_log_events",
                events[h],
                {
                    "logGroupName": "/aws/sagemaker/TrainingJobs",
                    "logStreamName": f"{job}/{h}-179539590{h[-1]}",
                    "startFromHead": True,
                    "limit": ANY,
                },
            )
            # The next page is empty and hands back the same token: the end of the stream.
            stub.add_response(
                "get_log_events",
                {"events": [], "nextForwardToken": "f/1", "nextBackwardToken": "b/1"},
                {
                    "logGroupName": "/aws/sagemaker/TrainingJobs",
                    "logStreamName": ANY,
                    "startFromHead": True,
                    "limit": ANY,
                    "nextToken": "f/1",
                },
            )
        out = backend.logs({"training_job_name": job, "hosts": ["algo-1", "algo-2"]}, {"algo-2": 2})
    assert out["algo-1"] == {
        "text": "[algo-1 rank 0] line 0\n[algo-1 rank 0] line 1\n[algo-1 rank 0] line 2\n",
        "offset": 3,
    }
    assert out["algo-2"] == {"text": "[algo-2 rank 0] line 2\n", "offset": 3}


# --- EventBridge ----------------------------------------------------------------------------------


def test_sagemaker_state_change_event_maps_to_an_aerie_attempt_event():
    event = json.loads((DATA / "eventbridge_training_job_failed.json").read_text())
    mapped = event_from_sagemaker(event)
    assert mapped == _golden("eventbridge_training_job_failed.aerie.json", mapped)
    d = mapped["detail"]
    assert mapped["detail-type"] == "Aerie Attempt State Change" and mapped["id"] == event["id"]
    assert (d["job_id"], d["attempt_id"], d["attempt"], d["state"]) == (JOB_ID, f"{JOB_ID}-a1", 1, "Failed")
    assert d["reason"]["kind"] == "silent.hang"  # the agent's verdict, quoted by SageMaker's FailureReason
    assert [t["status"] for t in d["transitions"]] == ["Starting", "Downloading", "Training", "Failed"]
    assert mapped["resources"] == [f"aerie:job/{JOB_ID}"]


def test_the_mapped_event_drives_chaining_to_a_resumed_attempt_two():
    """What chaining does with the mapped event: retry, then attempt 2's CreateTrainingJob."""
    from recovery.classify import classify

    event = json.loads((DATA / "eventbridge_training_job_failed.json").read_text())
    d = event_from_sagemaker(event)["detail"]
    spec = JobSpec.load(REPO / "examples" / "pythia-tiny-sagemaker.yaml")
    assert classify(d["reason"], spec.model_dump(mode="json")) == "retry"
    resume = f"s3://aerie-checkpoints/checkpoints/{d['job_id']}/step_00000300"
    body = create_training_job_request(_request(spec, d["attempt"] + 1, resume_from=resume))
    assert body == _golden("pythia-tiny-sagemaker.attempt-2.create_training_job.json", body)
    assert body["Environment"]["AERIE_RESUME_FROM"] == resume
    assert "CheckpointConfig" not in body  # the resume point streams from S3 (AERIE_RESUME_FROM)
    client = _client("sagemaker")
    with Stubber(client) as stub:
        stub.add_response(
            "create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"}, body
        )
        client.create_training_job(**body)


def test_events_not_started_by_aerie_are_refused():
    event = json.loads((DATA / "eventbridge_training_job_failed.json").read_text())
    event["detail"]["Tags"] = {"team": "other"}
    with pytest.raises(ValueError, match="not started by Aerie"):
        event_from_sagemaker(event)
