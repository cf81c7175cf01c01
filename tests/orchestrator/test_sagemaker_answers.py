"""What DescribeTrainingJob and ListTrainingJobs say about an Aerie job (orchestrator.sagemaker_answers,
and orchestrator.sagemaker_api.admission's limits of a backend).

Pure functions over a job and its attempts, so every state of a chain is written down here as
data: submitted, launching, training, restarting after a verdict, uploading, completed, failed,
stopping, stopped. The shapes are checked against SageMaker's own service model where it matters.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import botocore.session
import pytest

from aerie_contracts.sagemaker_api import SecondaryStatus, TrainingJobStatus
from lambdas.sagemaker_events import failure_reason
from orchestrator import sagemaker_answers as m
from orchestrator.sagemaker_api import admission
from orchestrator.store.models import Attempt, Node

SECONDARY = set(botocore.session.get_session().get_service_model("sagemaker").shape_for("SecondaryStatus").enum)
T0 = 1_800_000_000.0


def node(summary=None):
    return Node(summary=summary)


def attempt(number, state, created, **more):
    """The store's own attempt, unsaved (`more`: started_at, ended_at, reason, exit_code, resume_from, nodes)."""
    return Attempt(number=number, state=state, created_at=created, **more)


def job(state="InProgress", attempts=(), stop=False, ended=None, reason=None, max_restarts=1, count=2):
    return SimpleNamespace(
        state=state,
        attempts=list(attempts),
        stop_requested=stop,
        created_at=T0,
        updated_at=T0 + 1,
        ended_at=ended,
        reason=reason,
        backend="local",
        spec={"retry": {"max_restarts": max_restarts}, "resources": {"instance_count": count}},
    )


def statuses(j, now=T0 + 1000):
    transitions = m.secondary_transitions(j, [], "local", now)
    assert {t["Status"] for t in transitions} <= SECONDARY  # only SageMaker's own values
    for a, b in itertools.pairwise(transitions):
        assert a["EndTime"] == b["StartTime"] and a["StartTime"] <= b["StartTime"]
    return [t["Status"] for t in transitions], transitions


HANG = {"kind": "silent.hang", "message": "no step for 31s (ranks busy)", "host": "algo-2"}


def test_a_job_waiting_to_start_and_one_training():
    assert statuses(job(state="Submitted"))[0] == ["Starting"]
    assert m.training_job_status(job(state="Submitted")) == "InProgress"
    launching = job(attempts=[attempt(1, "Launching", T0 + 1)])
    assert statuses(launching)[0] == ["Starting", "Downloading"]
    running = job(attempts=[attempt(1, "Running", T0 + 1, started_at=T0 + 3)])
    names, transitions = statuses(running)
    assert names == ["Starting", "Downloading", "Training"]
    assert "EndTime" not in transitions[-1]  # the current one is open


def test_a_failed_attempt_shows_restarting_only_when_chaining_will_restart_it():
    failed = attempt(1, "Failed", T0 + 1, started_at=T0 + 3, ended_at=T0 + 40, reason=HANG, exit_code=1)
    names, transitions = statuses(job(attempts=[failed]))
    assert names[-1] == "Restarting" and "silent.hang" in transitions[-1]["StatusMessage"]
    assert m.training_job_status(job(attempts=[failed])) == "InProgress"
    assert statuses(job(attempts=[failed], max_restarts=0))[0][-1] == "Training"  # the job is about to fail
    user = attempt(1, "Failed", T0 + 1, started_at=T0 + 3, ended_at=T0 + 4, reason={"kind": "user.error"}, exit_code=2)
    assert statuses(job(attempts=[user], max_restarts=3))[0][-1] == "Training"


def test_a_restarted_job_shows_each_attempt_and_the_resume_point():
    first = attempt(1, "Failed", T0 + 1, started_at=T0 + 3, ended_at=T0 + 40, reason=HANG, exit_code=1)
    second = attempt(2, "Running", T0 + 41, started_at=T0 + 43, resume_from="s3://b/ckpt/job/step_00000008")
    names, transitions = statuses(job(attempts=[first, second]))
    assert names == ["Starting", "Downloading", "Training", "Restarting", "Training"]
    restart = transitions[3]
    assert restart["StartTime"] == T0 + 40 and restart["EndTime"] == T0 + 43
    assert "silent.hang" in restart["StatusMessage"] and "resumes from step 8" in restart["StatusMessage"]


def test_a_completed_job_with_its_upload_timings_and_billable_time():
    first = attempt(1, "Failed", T0 + 1, started_at=T0 + 10, ended_at=T0 + 20, reason=HANG, exit_code=1)
    up = node({"phase": "uploading", "phase_since": T0 + 45})
    second = attempt(2, "Completed", T0 + 21, started_at=T0 + 25, ended_at=T0 + 46, nodes=[up, node({})])
    j = job(state="Completed", attempts=[first, second], ended=T0 + 46)
    names, transitions = statuses(j)
    assert names == ["Starting", "Downloading", "Training", "Restarting", "Training", "Uploading", "Completed"]
    assert transitions[-1]["StartTime"] == transitions[-1]["EndTime"] == T0 + 46
    record = SimpleNamespace(
        name="done", arn="arn:x", warnings=[], request={"TrainingJobName": "done", "Foo": 1, "Tags": []}
    )
    d = m.describe_training_job(record, j, T0 + 100)
    assert d["TrainingJobStatus"] == "Completed" and d["SecondaryStatus"] == "Completed"
    assert d["TrainingStartTime"] == T0 + 10 and d["TrainingEndTime"] == T0 + 46
    assert d["TrainingTimeInSeconds"] == 36
    assert d["BillableTimeInSeconds"] == (10 + 21) * 2  # each attempt's run time x its 2 instances
    assert "Foo" not in d and "Tags" not in d  # only what DescribeTrainingJob's answer has
    assert "FailureReason" not in d


def test_a_failed_job_says_why_in_sagemakers_words():
    failed = attempt(1, "Failed", T0 + 1, started_at=T0 + 3, ended_at=T0 + 40, reason=HANG, exit_code=1)
    j = job(state="Failed", attempts=[failed], ended=T0 + 41, reason={**HANG, "retry_exhausted": True})
    record = SimpleNamespace(name="f", arn="arn:x", warnings=[], request={"TrainingJobName": "f"})
    d = m.describe_training_job(record, j, T0 + 100)
    assert d["TrainingJobStatus"] == "Failed" and d["SecondaryStatus"] == "Failed"
    assert d["FailureReason"] == "AlgorithmError: silent.hang: no step for 31s (ranks busy)"
    assert failure_reason(d["FailureReason"])[0]["kind"] == "silent.hang"  # and Aerie reads it back
    for kind, prefix in (("user.error", "ClientError"), ("node.lost", "InternalServerError")):
        j.reason = {"kind": kind, "message": "m"}
        assert m.describe_training_job(record, j, T0)["FailureReason"].startswith(f"{prefix}: {kind}")


def test_stopping_and_stopped():
    running = attempt(1, "Running", T0 + 1, started_at=T0 + 3)
    j = job(attempts=[running], stop=True)
    assert m.training_job_status(j) == "Stopping" and statuses(j)[0][-1] == "Stopping"
    stopped = attempt(1, "Stopped", T0 + 1, started_at=T0 + 3, ended_at=T0 + 30)
    j = job(state="Stopped", attempts=[stopped], stop=True, ended=T0 + 31)
    assert m.training_job_status(j) == "Stopped"
    assert statuses(j)[0][-2:] == ["Stopping", "Stopped"]


def test_final_metrics_are_each_definitions_last_match():
    text = "step 1/3 loss 6.5000 x\nstep 2/3 loss 5.2500 x\n12,345 tokens/s\nstep 3/3 loss nan\n"
    defs = [
        {"Name": "train:loss", "Regex": r"loss ([0-9.]+)"},
        {"Name": "tps", "Regex": r"([0-9]+),"},
        {"Name": "bad", "Regex": "("},
        {"Name": "absent", "Regex": "eval_loss ([0-9.]+)"},
    ]
    got = {x["MetricName"]: x["Value"] for x in m.metric_values(defs, text, T0)}
    assert got == {"train:loss": 5.25, "tps": 12.0}


def test_what_a_backend_cannot_run_is_refused_and_what_it_cannot_apply_is_named():
    algo = {"TrainingImage": "img", "ContainerEntrypoint": ["python", "train.py"]}
    base = {"AlgorithmSpecification": algo, "ResourceConfig": {"InstanceCount": 1}}
    refused = [
        {"AlgorithmSpecification": {"TrainingImage": "img"}},  # the image's own ENTRYPOINT: there is no image
        {"AlgorithmSpecification": {"AlgorithmName": "arn:aws:sagemaker:algorithm/x"}},
        {"ResourceConfig": {"InstanceGroups": [{"InstanceGroupName": "a"}]}},
        {"InputDataConfig": [{"ChannelName": "c", "DataSource": {"FileSystemDataSource": {}}}]},
        {"InputDataConfig": [{"ChannelName": "c", "DataSource": {"S3DataSource": {"S3DataType": "ManifestFile"}}}]},
        {"InputDataConfig": [{"ChannelName": "c", "InputMode": "Pipe", "DataSource": {"S3DataSource": {}}}]},
    ]
    for extra in refused:
        with pytest.raises(admission.Unsupported):
            admission.backend_limits({**base, **extra}, "local")
        assert admission.backend_limits({**base, **extra}, "sagemaker") == []
    # S3 channels arrive on every backend (the agent downloads them on local and Slurm nodes).
    s3 = {"InputDataConfig": [{"ChannelName": "c", "DataSource": {"S3DataSource": {"S3Uri": "s3://b/p"}}}]}
    for backend in ("local", "slurm", "sagemaker"):
        assert not [n for n in admission.backend_limits({**base, **s3}, backend) if "InputDataConfig" in n]
    assert admission.backend_limits({**base, "VpcConfig": {"Subnets": ["s"]}}, "local")[-1].startswith("VpcConfig")


def test_arns_name_the_tenants_account_and_the_lower_cased_name():
    a, b = m.account_id("default"), m.account_id("other")
    assert len(a) == len(b) == 12 and a.isdigit() and a != b and m.account_id("default") == a
    assert (
        m.training_job_arn("eu-west-1", "default", "My-Job") == f"arn:aws:sagemaker:eu-west-1:{a}:training-job/my-job"
    )


def test_on_the_sagemaker_backend_the_model_is_where_the_latest_attempts_training_job_put_it():
    request = {"TrainingJobName": "j", "OutputDataConfig": {"S3OutputPath": "s3://b/out/"}}
    j = job(attempts=[attempt(1, "Failed", T0), attempt(2, "Running", T0)])
    j.attempts[1].handle = {"training_job_name": "j-1a2b3c-a2"}
    assert m.model_artifacts_uri(request, j) == "s3://b/out/j/output/model.tar.gz"  # local: the job's name
    j.backend = "sagemaker"
    assert m.model_artifacts_uri(request, j) == "s3://b/out/j-1a2b3c-a2/output/model.tar.gz"


def test_the_contracts_status_words_are_sagemakers_own():
    """The enums the endpoint, the backend and the Lambda write in are botocore's lists, all of them."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert SecondaryStatus.values() == SECONDARY
    assert TrainingJobStatus.values() == set(model.shape_for("TrainingJobStatus").enum)
