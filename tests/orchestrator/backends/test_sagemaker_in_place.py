"""The sagemaker backend's in-place attempts (issue #22) against SageMaker's real service model
(botocore's Stubber): an in-place attempt sends no CreateTrainingJob and names the running training
job, a port of its own, and a training job that has ended is launched anew; a running attempt's
outcome comes from its agents' exit reports. The whole job on the SageMaker stand-in:
tests/e2e/test_sagemaker_in_place.py."""

from __future__ import annotations

import dataclasses
from unittest import mock

import boto3
from botocore.stub import Stubber

from aerie_contracts import memckpt
from aerie_contracts.states import AttemptState
from agent.identity import DEFAULT_MASTER_PORT
from orchestrator.backends.base import LaunchRequest, NodeStatus, PollResult, with_reported_exits
from orchestrator.backends.sagemaker import SageMakerBackend
from orchestrator.backends.sagemaker_request import create_training_job_request, in_place_port
from tests.helpers.launch_requests import launch_request

JOB = "warm-abc"


def _client():
    return boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")


def _request(number: int, retry: dict | None = None, in_place_of: dict | None = None, **options) -> LaunchRequest:
    spec = {
        "name": "warm",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/aerie/trainer:0.1.0",
        "output": {"s3_uri": "s3://b/out"},
        "resources": {"instance_type": "ml.m5.xlarge", "instance_count": 2},
        "backend": "sagemaker",
        "backend_options": {"sagemaker": {"RoleArn": "arn:aws:iam::1:role/r"}, **options},
    }
    return launch_request(number, spec, retry, in_place_of=in_place_of)


def _described(status: str) -> dict:
    return {
        "TrainingJobName": f"{JOB}-a1",
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:1:training-job/{JOB}-a1",
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training" if status == "InProgress" else status,
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "i"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": 1.0,
        "ModelArtifacts": {"S3ModelArtifacts": ""},
    }


def _first(client) -> dict:
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"})
        handle = SageMakerBackend(client=client).start(_request(1))
        stub.assert_no_pending_responses()
    return handle


def test_the_agents_wait_in_place_only_where_the_job_may_restart_in_place():
    env = create_training_job_request(_request(1))["Environment"]
    assert float(env["AERIE_IN_PLACE_WAIT_S"]) == SageMakerBackend.in_place_wait_s > 0
    for retry in ({"max_restarts": 0}, {"max_restarts": 2, "in_place_restarts": 0}):
        assert "AERIE_IN_PLACE_WAIT_S" not in create_training_job_request(_request(1, retry))["Environment"]


def test_an_in_place_attempt_names_the_running_training_job_and_creates_none():
    client = _client()
    first = _first(client)
    assert first["agents_wait"] is True and first["training_job_name"] == f"{JOB}-a1"
    backend = SageMakerBackend(client=client)
    with Stubber(client) as stub:  # a DescribeTrainingJob only: no CreateTrainingJob is expected
        stub.add_response("describe_training_job", _described("InProgress"), {"TrainingJobName": f"{JOB}-a1"})
        second = backend.start(_request(2, in_place_of=first))
        stub.add_response("describe_training_job", _described("InProgress"), {"TrainingJobName": f"{JOB}-a1"})
        third = backend.start(_request(3, in_place_of=second))
        stub.assert_no_pending_responses()
    assert second["training_job_name"] == third["training_job_name"] == f"{JOB}-a1"
    assert second["hosts"] == ["algo-1", "algo-2"]  # GET .../next hands the attempt to these hosts
    assert (second["attempt_id"], second["in_place"], second["in_place_restarts"]) == (f"{JOB}-a2", True, 1)
    assert third["in_place_restarts"] == 2 and backend.outcomes_from_agents(third)
    # A rendezvous port of each attempt's own, the same on every node (idempotent per attempt).
    ports = {DEFAULT_MASTER_PORT, second["master_port"], third["master_port"]}
    assert len(ports) == 3 and second["master_port"] == in_place_port(_request(2).spec, 1)
    assert in_place_port(_request(2, master_port=31000).spec, 1) == 31001


def test_an_in_place_attempt_whose_training_job_ended_is_launched_anew():
    """An instance went away (or the agents gave up waiting) after chaining chose in place."""
    client = _client()
    first = _first(client)
    with Stubber(client) as stub:
        stub.add_response("describe_training_job", _described("Failed"), {"TrainingJobName": f"{JOB}-a1"})
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/y"})
        second = SageMakerBackend(client=client).start(_request(2, in_place_of=first))
        stub.assert_no_pending_responses()
    assert second["training_job_name"] == f"{JOB}-a2" and "in_place" not in second


def test_a_running_training_job_ends_the_attempt_when_its_agents_report_so():
    running = PollResult(AttemptState.RUNNING, (NodeStatus("algo-1", "Running"), NodeStatus("algo-2", "Running")))
    crash = {"kind": "exit.nonzero", "host": "algo-2", "rank": 1, "at": 5.0, "message": "rank 1 exited"}
    stopped = {"kind": "user.stop", "host": "algo-1", "message": "stopped"}
    assert with_reported_exits(running, {}) is running
    # One node's worker group failed: the attempt fails with its cause (its peer still runs).
    failed = with_reported_exits(running, {"algo-2": {"exit_code": 1, "reason": crash, "t": 6.0}})
    assert (failed.state, failed.reason, failed.exit_code) == (AttemptState.FAILED, crash, 1)
    # The peer, told the attempt is over, stopped its ranks: still the crash's failure.
    both = {"algo-1": {"exit_code": 143, "reason": stopped, "t": 7.0}, "algo-2": {"exit_code": 1, "reason": crash}}
    assert with_reported_exits(running, both).reason == crash
    # One node done, one still training: running; both done: completed.
    done = {"exit_code": 0, "reason": None, "t": 8.0}
    assert with_reported_exits(running, {"algo-1": done}) is running
    assert with_reported_exits(running, {"algo-1": done, "algo-2": done}).state == AttemptState.COMPLETED
    # A failure an agent reported outranks the backend's later view of the end; without one, the
    # backend's view stands.
    lost = {"kind": "node.lost", "message": "training job warm-abc-a1 ended: exit code 1"}
    ended = PollResult(AttemptState.FAILED, running.nodes, lost, 1)
    assert with_reported_exits(ended, {"algo-2": {"exit_code": 1, "reason": crash}}).reason == crash
    assert with_reported_exits(ended, {"algo-1": {"exit_code": 143, "reason": stopped}}) is ended


def test_a_training_job_that_ends_under_waiting_agents_lost_a_node():
    """Its agents never end it on their own while the attempt runs: an instance (or agent) is gone,
    so chaining relaunches (a new training job) instead of restarting in a dead one."""
    client = _client()
    failed = {**_described("Failed"), "FailureReason": "AlgorithmError: exit code -9"}
    with Stubber(client) as stub:
        stub.add_response("describe_training_job", failed)
        stub.add_response("describe_training_job", failed)
        backend = SageMakerBackend(client=client)
        waiting = backend.poll({"training_job_name": f"{JOB}-a1", "hosts": ["algo-1"], "agents_wait": True})
        plain = backend.poll({"training_job_name": f"{JOB}-a1", "hosts": ["algo-1"]})
    assert waiting.state == plain.state == AttemptState.FAILED
    assert waiting.reason["kind"] == "node.lost" and "exit code -9" in waiting.reason["message"]
    assert plain.reason["kind"] == "exit.nonzero"


def test_hot_spares_are_extra_instances_of_the_training_job_and_take_slots_in_place():
    """Issue #23 on SageMaker: InstanceCount = nodes + `resources.spare_nodes`, the spares named on
    every instance (AERIE_SPARE_HOSTS); an in-place attempt gives a spare a failed node's slot."""
    spec = _request(1).spec.model_copy(
        update={"resources": _request(1).spec.resources.model_copy(update={"spare_nodes": 1})}
    )
    request = dataclasses.replace(_request(1), spec=spec)
    body = create_training_job_request(request, memory_key="ab" * 32)
    assert body["ResourceConfig"]["InstanceCount"] == 3 and body["Environment"]["AERIE_SPARE_HOSTS"] == "algo-3"
    client = _client()
    backend = SageMakerBackend(client=client)
    with Stubber(client) as stub, mock.patch.object(memckpt, "new_key", side_effect=["ab" * 32, "cd" * 32]):
        stub.add_response(
            "create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"}, body
        )
        first = backend.start(request)
        stub.add_response("describe_training_job", _described("InProgress"), {"TrainingJobName": f"{JOB}-a1"})
        swapped = dataclasses.replace(_request(2, in_place_of=first), spec=spec, replace_nodes={"algo-1": "algo-3"})
        second = backend.start(swapped)
        stub.assert_no_pending_responses()
    assert first["hosts"] == ["algo-1", "algo-2"] and first["spares"] == ["algo-3"]
    # The memory tier's key: the training job's for attempt 1, a new one for the in-place attempt.
    assert (first[memckpt.HANDLE_KEY], second[memckpt.HANDLE_KEY]) == ("ab" * 32, "cd" * 32)
    # The spare takes algo-1's rank slot (rank 0: the rendezvous moves with it); none is left.
    assert second["hosts"] == ["algo-3", "algo-2"] and second["spares"] == []
    assert second["replaced_nodes"] == {"algo-1": "algo-3"} and second["training_job_name"] == f"{JOB}-a1"
    # Without in-place restarts no spare could ever be handed a slot: none is asked for.
    off = spec.model_copy(update={"retry": spec.retry.model_copy(update={"in_place_restarts": 0})})
    body = create_training_job_request(dataclasses.replace(request, spec=off))
    assert body["ResourceConfig"]["InstanceCount"] == 2 and "AERIE_SPARE_HOSTS" not in body["Environment"]


def test_a_lost_node_with_a_spare_waiting_does_not_stop_the_training_job():
    """Fencing one instance would stop them all (StopTrainingJob); with a spare waiting to take its
    slot the store alone fences it."""
    client = _client()
    with Stubber(client) as stub:  # no StopTrainingJob expected
        SageMakerBackend(client=client).fence({"training_job_name": f"{JOB}-a1", "spares": ["algo-3"]}, ["algo-2"])
        stub.assert_no_pending_responses()
