"""What the SageMaker-compatible endpoint answers about an Aerie job: its read model.

DescribeTrainingJob and ListTrainingJobs entries, the SecondaryStatusTransitions they carry
(derived from the job's attempts, never stored), the names SageMaker gives a job (account, ARN,
model artifacts) and the final metrics read from its log. Pure functions of a job record, so
the endpoint's routes (`orchestrator/sagemaker_api`) and the tests call the same ones.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from typing import Any

from aerie_contracts import sagemaker_api as contract
from aerie_contracts.checkpoints import step_of_uri
from aerie_contracts.failures import stop_limit
from aerie_contracts.sagemaker_api import SecondaryStatus, TrainingJobStatus
from aerie_contracts.states import JOB_TERMINAL, AttemptState, JobState

# ListTrainingJobs' StatusEquals as (Aerie job states, stop requested?).
STATES_OF_STATUS: dict[str, tuple[tuple[str, ...], bool | None]] = {
    TrainingJobStatus.IN_PROGRESS: ((JobState.SUBMITTED, JobState.IN_PROGRESS), False),
    TrainingJobStatus.STOPPING: ((JobState.SUBMITTED, JobState.IN_PROGRESS), True),
    TrainingJobStatus.COMPLETED: ((JobState.COMPLETED,), None),
    TrainingJobStatus.FAILED: ((JobState.FAILED,), None),
    TrainingJobStatus.STOPPED: ((JobState.STOPPED,), None),
    TrainingJobStatus.DELETING: ((), None),
}


def account_id(tenant: str) -> str:
    """The 12-digit AWS account a tenant appears as in ARNs (stable, distinct per tenant)."""
    return str(int(hashlib.sha256(tenant.encode()).hexdigest(), 16) % 10**12).zfill(12)


def training_job_arn(region: str, tenant: str, name: str) -> str:
    # SageMaker lower-cases the name in a training job's ARN.
    return f"arn:aws:sagemaker:{region}:{account_id(tenant)}:training-job/{name.lower()}"


def training_job_status(job: Any) -> str:
    if job.state in JOB_TERMINAL:
        return job.state
    return TrainingJobStatus.STOPPING if job.stop_requested else TrainingJobStatus.IN_PROGRESS


def _will_restart(job: Any, attempt: Any) -> bool:
    """Whether chaining will follow this failed attempt with another: the recovery package's rules."""
    from recovery.policy import will_retry

    return will_retry(job.spec or {}, attempt.number, attempt.reason or {})


def _step(uri: str | None) -> str:
    step = step_of_uri(uri)
    return f"step {step}" if step is not None else "the start (no checkpoint yet)"


def secondary_transitions(job: Any, warnings: list[str], backend: str, now: float) -> list[dict[str, Any]]:
    """SageMaker's SecondaryStatusTransitions, from the job's attempts: Starting, Downloading (the
    launch: channels downloaded, nodes started), Training per attempt, Restarting between a failed
    attempt and the next (its message names the cause and the resume point), Uploading (the model
    upload the agent reports), then Completed / Failed / Stopping, Stopped."""
    steps: list[tuple[str, float, str]] = []
    message = f"Starting the training job on Aerie's {backend} backend."
    if warnings:
        message += " Not honoured on this backend: " + "; ".join(warnings) + "."
    steps.append((SecondaryStatus.STARTING, job.created_at, message))
    attempts = sorted(job.attempts, key=lambda a: a.number)
    for i, a in enumerate(attempts):
        if i == 0:
            steps.append((SecondaryStatus.DOWNLOADING, a.created_at, "Downloading input data and starting the nodes"))
        else:
            prev = attempts[i - 1]
            reason = prev.reason or {}
            steps.append(
                (
                    SecondaryStatus.RESTARTING,
                    prev.ended_at or a.created_at,
                    f"Attempt {prev.number} ended with {reason.get('kind', 'a failure')}"
                    + (f" ({str(reason.get('message'))[:300]})" if reason.get("message") else "")
                    + f"; attempt {a.number} resumes from {_step(a.resume_from)}",
                )
            )
        if a.started_at:
            steps.append((SecondaryStatus.TRAINING, a.started_at, f"Training in progress (attempt {a.number})"))
        uploading = [
            float(n.summary[contract.PHASE_SINCE])
            for n in a.nodes
            if n.summary
            and n.summary.get(contract.PHASE) == contract.PHASE_UPLOADING
            and n.summary.get(contract.PHASE_SINCE)
        ]
        if uploading and a.state in (AttemptState.RUNNING, AttemptState.COMPLETED):
            steps.append((SecondaryStatus.UPLOADING, min(uploading), "Uploading generated training model"))
    last = attempts[-1] if attempts else None
    if job.state not in JOB_TERMINAL:
        if (
            last is not None
            and last.state == AttemptState.FAILED
            and not job.stop_requested
            and _will_restart(job, last)
        ):
            reason = last.reason or {}
            steps.append(
                (
                    SecondaryStatus.RESTARTING,
                    last.ended_at or now,
                    f"Attempt {last.number} ended with {reason.get('kind')}; restarting from the last good checkpoint",
                )
            )
        if job.stop_requested:
            steps.append((SecondaryStatus.STOPPING, job.updated_at or now, "Stopping the training job"))
    elif job.state == JobState.COMPLETED:
        steps.append((SecondaryStatus.COMPLETED, job.ended_at or now, "Training job completed"))
    elif job.state == JobState.FAILED:
        steps.append((SecondaryStatus.FAILED, job.ended_at or now, "Training job failed"))
    else:
        limit = stop_limit(job.reason)  # stopped for a StoppingCondition: SageMaker's final status names it
        if job.stop_requested or limit is not None:
            steps.append(
                (
                    SecondaryStatus.STOPPING,
                    ((job.reason or {}).get("at") if limit is not None else None)
                    or (last.ended_at if last and last.ended_at else job.ended_at)
                    or now,
                    "Stopping the training job",
                )
            )
        steps.append(
            (limit.secondary_status, job.ended_at or now, limit.message)
            if limit is not None
            else (SecondaryStatus.STOPPED, job.ended_at or now, "The training job was stopped")
        )
    out: list[dict[str, Any]] = []
    floor = 0.0
    for status, start, msg in steps:
        floor = max(floor, float(start or floor))
        out.append({"Status": status, "StartTime": floor, "StatusMessage": msg})
    for here, nxt in itertools.pairwise(out):
        here["EndTime"] = nxt["StartTime"]
    if job.state in JOB_TERMINAL and out:
        out[-1]["EndTime"] = out[-1]["StartTime"]
    return out


def _training_window(job: Any) -> tuple[float | None, float]:
    """(first attempt's start, seconds billed = each attempt's run time x its instance count)."""
    count = int(((job.spec or {}).get("resources") or {}).get("instance_count", 1))
    started = [a.started_at for a in job.attempts if a.started_at]
    billed = sum((a.ended_at - a.started_at) * count for a in job.attempts if a.started_at and a.ended_at)
    return (min(started) if started else None), billed


def model_artifacts_uri(request: dict[str, Any], job: Any = None) -> str:
    """Where SageMaker puts a job's model: `<S3OutputPath>/<TrainingJobName>/output/model.tar.gz`.
    On the sagemaker backend the training job that ran is the latest attempt's (`<job id>-a<N>`)."""
    base = str((request.get("OutputDataConfig") or {}).get("S3OutputPath") or "").rstrip("/")
    name = request["TrainingJobName"]
    if job is not None and job.backend == "sagemaker":
        handles = [a.handle for a in sorted(job.attempts, key=lambda a: a.number) if getattr(a, "handle", None)]
        name = (handles[-1] or {}).get("training_job_name", name) if handles else name
    return f"{base}/{name}/output/model.tar.gz"


def metric_values(definitions: list[dict[str, Any]], text: str, t: float) -> list[dict[str, Any]]:
    """FinalMetricDataList: each MetricDefinition's last match in the job's log (group 1, or the
    whole match), as SageMaker scans the algorithm's output with the definition's regex."""
    out = []
    for d in definitions or []:
        try:
            pattern = re.compile(d.get("Regex") or "")
        except re.error:
            continue
        value = None
        for match in pattern.finditer(text):
            raw = match.group(1) if pattern.groups else match.group(0)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                continue
        if value is not None and value == value and abs(value) != float("inf"):
            out.append({"MetricName": d.get("Name"), "Value": value, "Timestamp": t})
    return out


@functools.cache
def _describe_members() -> frozenset[str]:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return frozenset(model.operation_model("DescribeTrainingJob").output_shape.members)


def describe_training_job(
    record: Any, job: Any, now: float, final_metrics: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """DescribeTrainingJob's answer: every field of the original request the answer has, the
    job's status, transitions, failure reason, metrics, timings and billable time."""
    request = record.request
    backend = job.backend
    members = _describe_members()
    out: dict[str, Any] = {k: v for k, v in request.items() if k in members}
    out.setdefault("StoppingCondition", {"MaxRuntimeInSeconds": 86400})
    transitions = secondary_transitions(job, list(record.warnings or []), backend, now)
    started, billed = _training_window(job)
    out.update(
        {
            "TrainingJobName": record.name,
            "TrainingJobArn": record.arn,
            "TrainingJobStatus": training_job_status(job),
            "SecondaryStatus": transitions[-1]["Status"],
            "SecondaryStatusTransitions": transitions,
            "ModelArtifacts": {"S3ModelArtifacts": model_artifacts_uri(request, job)},
            "CreationTime": job.created_at,
            "LastModifiedTime": max([job.updated_at or job.created_at] + [t["StartTime"] for t in transitions]),
        }
    )
    if started is not None:
        out["TrainingStartTime"] = started
    if job.state == JobState.FAILED:
        from lambdas.sagemaker_events import failure_reason_text

        out["FailureReason"] = failure_reason_text(job.reason)[:1024]
    if job.state in JOB_TERMINAL and job.ended_at:
        out["TrainingEndTime"] = job.ended_at
        if started is not None:
            out["TrainingTimeInSeconds"] = int(job.ended_at - started)
            out["BillableTimeInSeconds"] = int(billed)
    if final_metrics:
        out["FinalMetricDataList"] = final_metrics
    return out


def training_job_summary(record: Any, job: Any, now: float) -> dict[str, Any]:
    """One ListTrainingJobs entry."""
    transitions = secondary_transitions(job, [], job.backend, now)
    out = {
        "TrainingJobName": record.name,
        "TrainingJobArn": record.arn,
        "CreationTime": job.created_at,
        "TrainingJobStatus": training_job_status(job),
        "SecondaryStatus": transitions[-1]["Status"],
        "LastModifiedTime": max([job.updated_at or job.created_at] + [t["StartTime"] for t in transitions]),
    }
    if job.ended_at and job.state in JOB_TERMINAL:
        out["TrainingEndTime"] = job.ended_at
    return out
