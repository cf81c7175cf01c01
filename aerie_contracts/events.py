"""Events: what the outbox delivers, in EventBridge's envelope, to in-process or Lambda handlers.

Every state change is written with its event in one transaction and delivered at least once;
handlers are idempotent. The envelope is EventBridge's (`version`, `id`, `detail-type`, `source`,
`account`, `time`, `region`, `resources`, `detail`), so one handler runs in both places.
"""

from __future__ import annotations

from typing import Any, TypedDict

from aerie_contracts._strenum import StrEnum

SOURCE = "aerie.orchestrator"  # the `source` of every event Aerie publishes
# `detail.seq`: the event's sequence number in the control plane's outbox, set on every delivery
# (in-process and on EventBridge, whose envelope `id` is its own and new on each publication).
# It is the idempotency key: an event published twice (after a crash between the publication
# and the outbox row's update) carries the same `seq` both times, so a consumer can dedupe.
SEQ = "seq"
SAGEMAKER_SOURCE = "aws.sagemaker"  # real SageMaker events, mapped onto Aerie's shapes


class DetailType(StrEnum):
    JOB_STATE_CHANGE = "Aerie Job State Change"
    ATTEMPT_STATE_CHANGE = "Aerie Attempt State Change"
    CHECKPOINT_COMMITTED = "Aerie Checkpoint Committed"
    VERDICT_RAISED = "Aerie Verdict Raised"
    CHAOS_INJECTED = "Aerie Chaos Injected"  # audit: who asked for which fault on which rank
    PREFLIGHT_CHECKED = "Aerie Preflight Checked"  # a node's pre-flight result (aerie_contracts.preflight)
    SPARE_REPLACED = "Aerie Spare Replaced"  # a hot spare died while it waited; the backend started another
    # Published by SageMaker itself (EventBridge, source aws.sagemaker); chain_restart accepts it.
    SAGEMAKER_TRAINING_JOB_STATE_CHANGE = "SageMaker Training Job State Change"


class _JobDetail(TypedDict):
    job_id: str
    job_name: str


class _Delivered(TypedDict, total=False):
    seq: int  # SEQ: the outbox sequence number, added on delivery


class JobStateDetail(_JobDetail, _Delivered, total=False):
    state: str  # JobState
    reason: dict[str, Any]  # FailureReason


class AttemptStateDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    attempt: int
    state: str  # AttemptState
    reason: dict[str, Any]  # FailureReason
    exit_code: int
    resume_from: str
    # With state Running: the attempt's nodes in rank order, its hot spares (resources.spare_nodes),
    # and which spare took which failed node's slot ({failed host: spare host}).
    hosts: list[str]
    spares: list[str]
    replaced_nodes: dict[str, str]


class CheckpointCommittedDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    step: int
    uri: str


class VerdictRaisedDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    attempt: int
    host: str
    kind: str  # FailureKind
    message: str


class ChaosInjectedDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    host: str
    rank: int
    fault: str  # aerie_contracts.byo.CHAOS_FAULTS
    request_id: str
    by: str  # the token's name/kind that asked


class PreflightCheckedDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    attempt: int
    host: str
    passed: bool
    elapsed_s: float
    failed: list[str]  # names of the checks that failed (aerie_contracts.preflight.Check)
    summary: str  # aerie_contracts.preflight.summary_line
    spare: bool  # a hot spare's own checks (no attempt node: no verdict, the attempt goes on)


class SpareReplacedDetail(_JobDetail, _Delivered, total=False):
    attempt_id: str
    attempt: int
    host: str  # the spare that died while it waited
    replacement: str  # the spare started in its place ("" when the node pool ran out)
    why: str


DETAIL_SHAPES: dict[str, type] = {
    DetailType.JOB_STATE_CHANGE: JobStateDetail,
    DetailType.ATTEMPT_STATE_CHANGE: AttemptStateDetail,
    DetailType.CHECKPOINT_COMMITTED: CheckpointCommittedDetail,
    DetailType.VERDICT_RAISED: VerdictRaisedDetail,
    DetailType.CHAOS_INJECTED: ChaosInjectedDetail,
    DetailType.PREFLIGHT_CHECKED: PreflightCheckedDetail,
    DetailType.SPARE_REPLACED: SpareReplacedDetail,
}


# The event patterns of the deployed stack's EventBridge rules (infra/aws/aerie_cdk/handlers.py
# builds its rules from these), so what the control plane publishes and what the rules filter on
# are defined in one place. Aerie's own events go to the Aerie bus; SageMaker's to the default bus.
ATTEMPT_FAILED_PATTERN: dict[str, Any] = {
    "source": [SOURCE],
    "detail-type": [DetailType.ATTEMPT_STATE_CHANGE.value],
    "detail": {"state": ["Failed"]},  # AttemptState.FAILED
}
CHECKPOINT_COMMITTED_PATTERN: dict[str, Any] = {
    "source": [SOURCE],
    "detail-type": [DetailType.CHECKPOINT_COMMITTED.value],
}
SAGEMAKER_JOB_ENDED_PATTERN: dict[str, Any] = {
    "source": [SAGEMAKER_SOURCE],
    "detail-type": [DetailType.SAGEMAKER_TRAINING_JOB_STATE_CHANGE.value],
    "detail": {"TrainingJobStatus": ["Failed", "Stopped", "Completed"]},
}
