"""SageMaker's own EventBridge events and training-job states, in Aerie's terms.

Pure functions, standard library only, so `chain_restart` can map a real "SageMaker Training Job
State Change" event in AWS Lambda (whose bundle has `lambdas/` but not the control plane), and the
SageMaker backend maps DescribeTrainingJob answers with the very same rules.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from aerie_contracts import DetailType, FailureKind
from aerie_contracts.sagemaker_api import SecondaryStatus, TrainingJobStatus
from aerie_contracts.states import AttemptState

STARTING = {
    SecondaryStatus.STARTING,
    SecondaryStatus.PENDING,
    SecondaryStatus.LAUNCHING_ML_INSTANCES,
    SecondaryStatus.PREPARING_TRAINING_STACK,
    SecondaryStatus.DOWNLOADING,
    SecondaryStatus.DOWNLOADING_TRAINING_IMAGE,
    SecondaryStatus.RESTARTING,
    "Provisioning",  # not one of botocore's SecondaryStatus words; kept so it still reads as starting
}
# SageMaker's TrainingJobStatus of an ended training job, as the attempt's state.
ENDED: dict[str, AttemptState] = {
    TrainingJobStatus.COMPLETED: AttemptState.COMPLETED,
    TrainingJobStatus.FAILED: AttemptState.FAILED,
    TrainingJobStatus.STOPPED: AttemptState.STOPPED,
}
# The FailureReason's prefix says whose fault it was.
FAILURE_KINDS = {
    "AlgorithmError": FailureKind.EXIT_NONZERO,
    "ClientError": FailureKind.USER_ERROR,
    "CapacityError": FailureKind.LAUNCH_FAILED,
    "InternalServerError": FailureKind.NODE_LOST,
}
# The agent writes "<kind>: <message>" to /opt/ml/output/failure; SageMaker quotes it after the prefix.
AERIE_KIND = re.compile(r"^([a-z]+\.[a-z_]+): ?(.*)$", re.S)
# "exit code 137" (SageMaker's own words) or "exited with code 137 (signal 9)" (the agent's).
EXIT_CODE = re.compile(r"exit(?:ed with)? code (\d+)")
RANK = re.compile(r"\brank (\d+)\b")


def attempt_state(status: str, secondary: str | None) -> AttemptState:
    """SageMaker's TrainingJobStatus (+ SecondaryStatus) as an Aerie attempt state."""
    if status == TrainingJobStatus.IN_PROGRESS:
        return AttemptState.STARTING if secondary in STARTING else AttemptState.RUNNING
    if status == TrainingJobStatus.STOPPING:
        return AttemptState.RUNNING  # still ending; the next poll says Stopped
    return ENDED.get(status, AttemptState.STARTING)


def failure_reason(text: str | None) -> tuple[dict[str, Any], int | None]:
    """SageMaker's FailureReason as Aerie's reason (kind + message) and the exit code it names."""
    text = (text or "").strip()
    prefix, _, rest = text.partition(":")
    kind: str = FAILURE_KINDS.get(prefix.strip(), FailureKind.EXIT_NONZERO)
    rest = rest.strip() if rest else text
    own = AERIE_KIND.match(rest)
    if prefix.strip() == "AlgorithmError" and own:
        kind = own.group(1)  # the agent's own verdict, quoted from output/failure
    code_match = EXIT_CODE.search(text)
    code = int(code_match.group(1)) if code_match else None
    reason: dict[str, Any] = {"kind": kind, "message": text or "training job failed", "sagemaker": prefix.strip()}
    if code is not None:
        reason["exit_code"] = code
        if code > 128:
            reason["signal"] = code - 128
    rank = RANK.search(rest) if own else None
    if rank:
        reason["rank"] = int(rank.group(1))
    return reason, code


def failure_reason_text(reason: dict[str, Any] | None) -> str:
    """Aerie's reason as SageMaker's FailureReason, `<Prefix>: <kind>: <message>`, the inverse of
    `failure_reason` (which reads the kind back from it): the prefix says whose fault it was."""
    reason = reason or {}
    kind = str(reason.get("kind") or FailureKind.EXIT_NONZERO)
    prefix = next((p for p, k in FAILURE_KINDS.items() if k == kind), "AlgorithmError")
    message = str(reason.get("message") or "").strip()
    return f"{prefix}: {kind}: {message}" if message else f"{prefix}: {kind}"


def transitions(described: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """SecondaryStatusTransitions as plain dicts with epoch-second times."""
    out = []
    for t in described.get("SecondaryStatusTransitions") or []:
        out.append(
            {
                "status": t.get("Status"),
                "start": _epoch(t.get("StartTime")),
                "end": _epoch(t.get("EndTime")),
                "message": t.get("StatusMessage", ""),
            }
        )
    return tuple(out)


# --- SageMaker's EventBridge events ---------------------------------------------------------------

ATTEMPT_NUMBER = re.compile(r"(\d+)$")


def event_from_sagemaker(event: dict[str, Any]) -> dict[str, Any]:
    """A "SageMaker Training Job State Change" event as an "Aerie Attempt State Change" event.

    The attempt is found through the `aerie:*` tags the backend put on the training job (EventBridge
    carries them in `detail.Tags`); the event id is kept, so a redelivered SageMaker event maps to
    the same Aerie event and idempotent handlers see one failure, not two.
    """
    if event.get("detail-type") != DetailType.SAGEMAKER_TRAINING_JOB_STATE_CHANGE:
        raise ValueError(f"not a SageMaker training job event: {event.get('detail-type')!r}")
    d = event["detail"]
    tags = d.get("Tags") or {}
    if isinstance(tags, list):
        tags = {t["Key"]: t["Value"] for t in tags}
    job_id, attempt_id = tags.get("aerie:job"), tags.get("aerie:attempt")
    if not job_id or not attempt_id:
        raise ValueError(
            f"training job {d.get('TrainingJobName')!r} has no aerie:job/aerie:attempt tags: "
            "it was not started by Aerie"
        )
    number = ATTEMPT_NUMBER.search(attempt_id)
    state = attempt_state(d["TrainingJobStatus"], d.get("SecondaryStatus"))
    reason, code = None, 0 if state == AttemptState.COMPLETED else None
    if state == AttemptState.FAILED:
        reason, code = failure_reason(d.get("FailureReason"))
        code = code if code is not None else 1
    detail: dict[str, Any] = {
        "job_id": job_id,
        "attempt_id": attempt_id,
        "attempt": int(number.group(1)) if number else None,
        "state": state,
        "training_job_name": d.get("TrainingJobName"),
        "sagemaker_status": d.get("TrainingJobStatus"),
        "secondary_status": d.get("SecondaryStatus"),
        "transitions": list(transitions(d)),
    }
    if tags.get("aerie:job-name"):
        detail["job_name"] = tags["aerie:job-name"]
    if reason:
        detail["reason"] = reason
    if code is not None:
        detail["exit_code"] = code
    return {
        "version": "0",
        "id": event["id"],
        "detail-type": DetailType.ATTEMPT_STATE_CHANGE,
        "source": "aerie.orchestrator",
        "account": event.get("account", ""),
        "time": event.get("time", ""),
        "region": event.get("region", ""),
        "resources": [f"aerie:job/{job_id}"],
        "detail": detail,
    }


def _epoch(value: Any) -> float | None:
    """boto3 gives datetimes; EventBridge gives epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=value.tzinfo or timezone.utc).timestamp()
    seconds = float(value)
    return seconds / 1000.0 if seconds > 1e11 else seconds
