"""StoppingCondition on every backend (issue #37): MaxRuntimeInSeconds over the attempts' training
time, MaxWaitTimeInSeconds over the time since submission; the job is stopped as a user's stop
stops it and ends Stopped with SageMaker's MaxRuntimeExceeded / MaxWaitTimeExceeded.

The decision (orchestrator/stopping.py) is tested on an injected clock; the controller on a
recording backend; the whole job on the local and Slurm backends in
tests/integration/test_max_runtime.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from aerie_contracts.failures import STOP_LIMITS, FailureKind, stop_limit
from orchestrator import sagemaker_answers
from orchestrator import sagemaker_mapping as mapping
from orchestrator.backends.base import Backend, NodeStatus, PollResult
from orchestrator.backends.sagemaker_state import poll_result
from orchestrator.controller import Controller
from orchestrator.sagemaker_api import admission as sagemaker_admission
from orchestrator.settings import Settings
from orchestrator.spec import JobSpec
from orchestrator.stopping import exceeded, training_seconds
from orchestrator.store import Database, repo

T0 = 1_000_000.0  # the injected clock's origin: the job's creation


# --- the decision, on an injected clock -----------------------------------------------------------


def test_training_time_sums_the_attempts_and_skips_the_gaps_between_them():
    # Attempt 1 ran 10 s, then 50 s of restart decision and relaunch, attempt 2 runs since T0 + 60.
    spans = [(T0, T0 + 10), (T0 + 60, None)]
    assert training_seconds(spans, T0 + 60) == 10
    assert training_seconds(spans, T0 + 75) == 25
    assert training_seconds([(None, None)], T0 + 75) == 0  # not started yet: no training
    # An in-place successor recorded running a moment before its predecessor's end: counted once.
    assert training_seconds([(T0, T0 + 10), (T0 + 9, T0 + 20)], T0 + 30) == 20


def test_max_runtime_is_exceeded_by_the_attempts_in_total_not_each():
    stopping = {"max_runtime_s": 30}
    spans = [(T0, T0 + 20), (T0 + 100, None)]  # a restart does not reset the clock
    assert exceeded(stopping, T0, spans, T0 + 110) is None  # 20 + 10 s: at the limit, not over it
    why = exceeded(stopping, T0, spans, T0 + 111)
    assert why is not None and why["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED == "stopping.max_runtime"
    assert why["message"].startswith("Training job runtime exceeded MaxRuntimeInSeconds provided")
    assert why["evidence"] == {"training_s": 31.0, "max_runtime_s": 30.0} and why["at"] == T0 + 111
    assert stop_limit(why).secondary_status == "MaxRuntimeExceeded"


def test_exactly_at_the_limit_and_a_job_that_never_ran_are_not_over():
    assert exceeded({"max_runtime_s": 30}, T0, [(T0, None)], T0 + 30) is None
    assert exceeded({"max_runtime_s": 30}, T0, [], T0 + 10_000) is None  # waiting only: MaxWait's business
    assert exceeded(None, T0, [(T0, None)], T0 + 86_400) is None  # SageMaker's default: one day
    assert exceeded(None, T0, [(T0, None)], T0 + 86_401)["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED


def test_max_wait_counts_the_wall_clock_since_submission_waits_included():
    stopping = {"max_runtime_s": 30, "max_wait_s": 60}
    spans = [(T0 + 40, None)]  # 40 s waiting for capacity, then training
    assert exceeded(stopping, T0, spans, T0 + 60) is None  # 20 s of training, 60 s in all
    why = exceeded(stopping, T0, spans, T0 + 61)
    assert why["kind"] == FailureKind.MAX_WAIT_EXCEEDED and stop_limit(why).secondary_status == "MaxWaitTimeExceeded"
    assert why["evidence"]["waited_s"] == 61.0 and why["evidence"]["training_s"] == 21.0
    # Both out: the runtime is named (MaxWait >= MaxRuntime, so it ran out first or together).
    assert exceeded(stopping, T0, [(T0, None)], T0 + 61)["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED


# --- the spec and the request ---------------------------------------------------------------------


def test_max_wait_below_max_runtime_is_refused_as_sagemaker_refuses_it():
    base = {"name": "j", "entrypoint": ["python", "train.py"]}
    with pytest.raises(ValueError, match="greater than or equal to MaxRuntimeInSeconds") as refused:
        JobSpec.model_validate({**base, "stopping": {"max_runtime_s": 60, "max_wait_s": 30}})
    assert [e["loc"] for e in refused.value.errors()] == [("stopping",)]  # StoppingCondition, in AWS's paths
    spec = JobSpec.model_validate({**base, "stopping": {"max_runtime_s": 60, "max_wait_s": 60}})
    assert spec.stopping.max_wait_s == 60


def test_a_request_s_stopping_condition_is_stored_and_no_longer_said_to_be_ignored():
    from tests.helpers.sagemaker import request

    stopping = {"MaxRuntimeInSeconds": 30, "MaxWaitTimeInSeconds": 90}
    body = request("lim", StoppingCondition=stopping, EnableManagedSpotTraining=True)
    spec = mapping.spec_from_request(body)
    assert (spec.stopping.max_runtime_s, spec.stopping.max_wait_s) == (30, 90)
    assert mapping.request_from_spec(spec)["StoppingCondition"] == stopping
    # Without managed spot SageMaker takes no MaxWaitTimeInSeconds; Aerie's backends enforce it all the same.
    on_demand = mapping.spec_from_request(request("lim", StoppingCondition=stopping))
    assert on_demand.stopping.max_wait_s == 90
    assert mapping.request_from_spec(on_demand)["StoppingCondition"] == {"MaxRuntimeInSeconds": 30}
    for backend in ("local", "slurm"):
        assert not [w for w in sagemaker_admission.backend_limits(body, backend) if "StoppingCondition" in w]
    with pytest.raises(ValueError, match="MaxWaitTimeInSeconds"):
        mapping.spec_from_request(
            request("w", StoppingCondition={"MaxRuntimeInSeconds": 90, "MaxWaitTimeInSeconds": 30})
        )


# --- the controller -------------------------------------------------------------------------------


class Recorder(Backend):
    name = "local"

    def __init__(self):
        self.calls: list[str] = []
        self.state = "Running"
        self.reason: dict | None = None

    def launch(self, request):
        raise AssertionError("nothing to launch")

    def poll(self, handle):
        return PollResult(self.state, (NodeStatus("algo-1", self.state),), self.reason)

    def stop(self, handle):
        self.calls.append("stop")

    def logs(self, handle, offsets=None, max_bytes=1 << 20):
        return {}


def _running_job(db: Database, trained_s: float, stopping: dict, backend: str = "local") -> str:
    """A job whose one attempt has run `trained_s` seconds, its node heartbeating."""
    with db.session() as s:
        job = repo.create_job(s, {"name": "lim", "backend": backend, "stopping": stopping}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        attempt.started_at = time.time() - trained_s
        attempt.handle = {"root": "/nowhere", "hosts": ["algo-1"]}
        repo.record_heartbeat(s, attempt, "algo-1", {})
        return job.id


def test_a_job_over_max_runtime_is_stopped_once_as_a_user_stop_and_ends_stopped(aerie_home, sqlite_db):
    db, backend = sqlite_db, Recorder()
    job_id = _running_job(db, 40, {"max_runtime_s": 30})
    controller = Controller(db, Settings(), {"local": backend})
    controller.reconcile_once()
    assert backend.calls == ["stop"]  # the user's stop path: the backend's stop, SIGTERM to the agents
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.stop_requested and job.state == "InProgress"
        decided = dict(job.reason)
        assert decided["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED
        job.stop_requested = True  # a user's StopTrainingJob meanwhile (or the decision delivered again)
    controller.reconcile_once()
    with db.session() as s:
        assert repo.get_job(s, "default", job_id).reason == decided  # decided once, not again
    backend.state = "Stopped"  # the nodes stopped
    controller.reconcile_once()
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Stopped" and job.reason == decided, job.reason
        assert [(a.state, a.reason) for a in job.attempts] == [("Stopped", decided)]
        described = sagemaker_answers.secondary_transitions(job, [], "local", time.time())
    assert [t["Status"] for t in described][-2:] == ["Stopping", "MaxRuntimeExceeded"]
    assert described[-1]["StatusMessage"] == "Training job runtime exceeded MaxRuntimeInSeconds provided"


def test_a_healthy_job_within_its_limits_is_left_alone(aerie_home, sqlite_db):
    db, backend = sqlite_db, Recorder()
    job_id = _running_job(db, 20, {"max_runtime_s": 30, "max_wait_s": 3600})
    Controller(db, Settings(), {"local": backend}).reconcile_once()
    assert backend.calls == []
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert not job.stop_requested and job.reason is None and job.state == "InProgress"


def test_a_user_stop_keeps_its_own_reason(aerie_home, sqlite_db):
    db, backend = sqlite_db, Recorder()
    job_id = _running_job(db, 40, {"max_runtime_s": 30})
    with db.session() as s:
        repo.get_job(s, "default", job_id).stop_requested = True  # the user asked first
    controller = Controller(db, Settings(), {"local": backend})
    controller.reconcile_once()
    backend.state = "Stopped"
    controller.reconcile_once()
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Stopped" and job.reason["kind"] == FailureKind.USER_STOP


def test_on_the_sagemaker_backend_sagemaker_s_own_stop_ends_the_job_stopped_for_the_limit(aerie_home, sqlite_db):
    db, backend = sqlite_db, Recorder()
    job_id = _running_job(db, 40, {"max_runtime_s": 30}, backend="sagemaker")
    controller = Controller(db, Settings(), {"sagemaker": backend})
    controller.reconcile_once()
    assert backend.calls == []  # SageMaker enforces it: Aerie does not race it with StopTrainingJob
    backend.state = "Stopped"
    backend.reason = poll_result({"TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxRuntimeExceeded"}, []).reason
    controller.reconcile_once()
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        assert job.state == "Stopped" and job.reason["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED, job.reason
        assert [a.reason["kind"] for a in job.attempts] == [FailureKind.MAX_RUNTIME_EXCEEDED]  # not node.lost


# --- SageMaker's answers --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(STOP_LIMITS))
def test_describe_of_a_job_stopped_for_a_limit_says_so_as_sagemaker_does(kind):
    limit = STOP_LIMITS[kind]
    attempt = SimpleNamespace(
        number=1, created_at=T0 + 1, started_at=T0 + 2, ended_at=T0 + 40, state="Stopped", reason=None, nodes=[]
    )
    job = SimpleNamespace(
        state="Stopped",
        stop_requested=True,
        reason={"kind": kind, "message": limit.message, "at": T0 + 32},
        attempts=[attempt],
        created_at=T0,
        updated_at=T0 + 40,
        ended_at=T0 + 41,
        spec={},
        backend="slurm",
    )
    out = sagemaker_answers.secondary_transitions(job, [], "slurm", T0 + 50)
    assert [t["Status"] for t in out] == ["Starting", "Downloading", "Training", "Stopping", limit.secondary_status]
    assert out[-2]["StartTime"] == T0 + 32  # when the limit ran out
    assert out[-1]["StatusMessage"] == limit.message and out[-1]["EndTime"] == out[-1]["StartTime"]
    assert sagemaker_answers.training_job_status(job) == "Stopped"


def test_sagemaker_s_own_max_runtime_stop_is_read_as_the_limit_not_a_lost_node():
    described = {"TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxRuntimeExceeded"}
    result = poll_result(described, ["algo-1"])
    assert result.state == "Stopped" and result.reason["kind"] == FailureKind.MAX_RUNTIME_EXCEEDED
    assert poll_result({"TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped"}, []).reason is None


def test_boto3_gets_validation_exception_for_max_wait_below_max_runtime_and_nothing_is_stored(tmp_path):
    from botocore.exceptions import ClientError

    from orchestrator.server import build_app
    from tests.helpers.sagemaker import aws_keys, client, request, serve

    settings = Settings(home=tmp_path / "home")
    app = build_app(settings, with_controller=False)
    with serve(app) as url:
        sm = client("sagemaker", url, aws_keys(url, settings.admin_token_path.read_text().strip()))
        stopping = {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 1800}
        with pytest.raises(ClientError) as err:
            sm.create_training_job(**request("wait-too-short", StoppingCondition=stopping))
        error = err.value.response["Error"]
        assert error["Code"] == "ValidationException", error
        assert "MaxWaitTimeInSeconds" in error["Message"] and "MaxRuntimeInSeconds" in error["Message"], error
        assert sm.list_training_jobs()["TrainingJobSummaries"] == []
        stopping["MaxWaitTimeInSeconds"] = 7200
        sm.create_training_job(**request("wait-ok", StoppingCondition=stopping))
        described = sm.describe_training_job(TrainingJobName="wait-ok")
        assert described["StoppingCondition"] == stopping
