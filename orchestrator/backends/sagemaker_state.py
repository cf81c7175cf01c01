"""What a DescribeTrainingJob answer means for an attempt of the `sagemaker` backend.

Poll maps SageMaker's status onto Aerie's states, keeping `SecondaryStatusTransitions` for the
controller to emit. The mapping itself lives with the Lambda handlers (`lambdas.sagemaker_events`,
which must ship to AWS Lambda alone), so a poll here and SageMaker's EventBridge events there read
a status the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aerie_contracts.failures import STOP_LIMITS
from aerie_contracts.states import AttemptState
from lambdas.sagemaker_events import _epoch, attempt_state, failure_reason, transitions
from orchestrator.backends.base import NodeStatus, PollResult


@dataclass(frozen=True)
class SageMakerPollResult(PollResult):
    """A PollResult that also carries SageMaker's own step history, for the controller to emit."""

    transitions: tuple[dict[str, Any], ...] = ()
    secondary_status: str | None = None


def poll_result(described: dict[str, Any], hosts: list[str]) -> SageMakerPollResult:
    """One DescribeTrainingJob answer as the attempt's PollResult."""
    status = described["TrainingJobStatus"]
    secondary = described.get("SecondaryStatus")
    state = attempt_state(status, secondary)
    reason, code = (None, None)
    if state == AttemptState.FAILED:
        reason, code = failure_reason(described.get("FailureReason"))
        code = code if code is not None else 1
    elif state == AttemptState.COMPLETED:
        code = 0
    elif state == AttemptState.STOPPED:
        # SageMaker stopped it for its StoppingCondition (MaxRuntimeExceeded, MaxWaitTimeExceeded):
        # the job ends Stopped with that reason, as the control plane's own enforcement ends it.
        limit = next((v for v in STOP_LIMITS.values() if v.secondary_status == secondary), None)
        reason = {"kind": limit.kind.value, "message": limit.message} if limit else None
    ended = _epoch(described.get("TrainingEndTime"))
    ended_code = code if state in (AttemptState.COMPLETED, AttemptState.FAILED) else None
    nodes = tuple(NodeStatus(h, state, ended_code, reason, ended) for h in hosts)
    # Before "Training" SageMaker is still provisioning instances and pulling the image.
    queued = state == AttemptState.STARTING
    return SageMakerPollResult(state, nodes, reason, code, transitions(described), secondary, queued=queued)
