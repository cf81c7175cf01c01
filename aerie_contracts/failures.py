"""Failure kinds and what each means for the job: retried or not, and whose fault it is.

One table (`POLICIES`) answers the two questions chaining asks about a failed attempt: may a
restart help (`retry`), and is a node to blame (`blame`)? A kind not in the table is treated as
not retryable, so a typo fails loudly instead of looping through the retry budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from aerie_contracts._strenum import StrEnum
from aerie_contracts.sagemaker_api import SecondaryStatus


class FailureKind(StrEnum):
    # Detected by the node agent (agent/detect.py).
    SILENT_HANG = "silent.hang"
    SILENT_GPU_IDLE = "silent.gpu_idle"
    SILENT_NIC_STALL = "silent.nic_stall"
    LOSS_NAN = "loss.nan"
    LOSS_SPIKE = "loss.spike"
    CHECKPOINT_STALLED = "checkpoint.stalled"
    # Decided by the control plane.
    NODE_LOST = "node.lost"
    NODE_STRAGGLER = "node.straggler"
    NODE_PREEMPTED = "node.preempted"
    SDC_SUSPECT = "sdc.suspect"
    PREFLIGHT_FAILED = "preflight.failed"
    # How processes ended.
    EXIT_NONZERO = "exit.nonzero"
    EXIT_OOM = "exit.oom"
    LAUNCH_FAILED = "launch.failed"
    PLACEMENT_FAILED = "placement.failed"
    CHECKPOINT_FAILED = "checkpoint.failed"
    UPLOAD_FAILED = "upload.failed"
    SAGEMAKER_FAILED = "sagemaker.failed"
    # Not the platform's to fix.
    USER_ERROR = "user.error"
    INPUT_UNAVAILABLE = "input.unavailable"
    USER_STOP = "user.stop"
    # A job's StoppingCondition ran out (orchestrator/stopping.py): stopped as a user's stop is.
    MAX_RUNTIME_EXCEEDED = "stopping.max_runtime"
    MAX_WAIT_EXCEEDED = "stopping.max_wait"
    CHAIN_DEAD_LETTER = "chain.dead_letter"


class Blame(StrEnum):
    NONE = "none"  # nobody's hardware: the data, the model, the code, or chance
    NODE = "node"  # the node named by the reason's `host` (for a hang: the node whose ranks stopped first)


class BlameRule(StrEnum):
    """Why chaining blamed a node (`recovery/blame.py` applies them, in this order for a hang)."""

    ONLY_NODE = "only_node"  # the attempt had one node: nobody else could have stopped it
    WAITED_FOR = "waited_for"  # its rank is the one the others wait for, from the ranks' stacks (recovery/hang_root.py)
    STOPPED_RANK = "stopped_rank"  # a rank of the node was stopped, a zombie or gone when the hang was seen
    STALEST = "stalest"  # the node's ranks stopped first: an earlier last step, or the same one clearly earlier
    NOT_WAITING = "not_waiting"  # a device doing what no waiting rank does (busy on CPU, idle on GPU)
    LINK_DOWN = "link_down"  # the node's own NIC link was down when the stall was seen
    REPORTED = "reported"  # a node-local cause (an idle GPU, a lost node, ...) the node itself names


@dataclass(frozen=True)
class Policy:
    retry: bool
    blame: Blame
    user_error: bool = False  # ends the job as the user's fault: retrying cannot help
    meaning: str = ""


POLICIES: dict[FailureKind, Policy] = {
    FailureKind.SILENT_HANG: Policy(True, Blame.NODE, meaning="no step for longer than the learned step limit"),
    FailureKind.SILENT_GPU_IDLE: Policy(True, Blame.NODE, meaning="one accelerator idle while its peers work"),
    FailureKind.SILENT_NIC_STALL: Policy(True, Blame.NODE, meaning="a NIC's throughput collapsed while steps slowed"),
    FailureKind.LOSS_NAN: Policy(True, Blame.NONE, meaning="non-finite loss (replayed once to tell data from SDC)"),
    FailureKind.LOSS_SPIKE: Policy(True, Blame.NONE, meaning="loss far above its robust baseline for several steps"),
    FailureKind.CHECKPOINT_STALLED: Policy(True, Blame.NODE, meaning="a checkpoint upload exceeded its learned limit"),
    FailureKind.NODE_LOST: Policy(True, Blame.NODE, meaning="no heartbeat (or never one) for too long"),
    FailureKind.NODE_STRAGGLER: Policy(True, Blame.NODE, meaning="a node's step time an outlier against its peers"),
    FailureKind.NODE_PREEMPTED: Policy(True, Blame.NONE, meaning="the platform took the node back"),
    FailureKind.SDC_SUSPECT: Policy(True, Blame.NODE, meaning="a NaN that did not recur on replay"),
    FailureKind.PREFLIGHT_FAILED: Policy(True, Blame.NODE, meaning="a node failed its pre-flight check"),
    FailureKind.EXIT_NONZERO: Policy(True, Blame.NONE, meaning="a rank or launcher exited non-zero"),
    FailureKind.EXIT_OOM: Policy(True, Blame.NONE, meaning="a rank was killed for memory"),
    FailureKind.LAUNCH_FAILED: Policy(True, Blame.NONE, meaning="the backend could not start the attempt"),
    FailureKind.PLACEMENT_FAILED: Policy(
        False, Blame.NONE, meaning="the nodes left after excluding blamed ones cannot hold the job"
    ),
    FailureKind.CHECKPOINT_FAILED: Policy(True, Blame.NONE, meaning="a checkpoint save or restore failed"),
    FailureKind.UPLOAD_FAILED: Policy(True, Blame.NONE, meaning="the model upload after a clean run failed"),
    FailureKind.SAGEMAKER_FAILED: Policy(True, Blame.NONE, meaning="SageMaker reported the training job failed"),
    FailureKind.USER_ERROR: Policy(False, Blame.NONE, user_error=True, meaning="the job's code or input is wrong"),
    FailureKind.INPUT_UNAVAILABLE: Policy(
        False, Blame.NONE, user_error=True, meaning="an input channel's S3 prefix is missing or not readable"
    ),
    FailureKind.USER_STOP: Policy(False, Blame.NONE, meaning="stopped on request"),
    FailureKind.MAX_RUNTIME_EXCEEDED: Policy(
        False, Blame.NONE, meaning="training time over stopping.max_runtime_s (MaxRuntimeInSeconds): stopped"
    ),
    FailureKind.MAX_WAIT_EXCEEDED: Policy(
        False, Blame.NONE, meaning="time since submission over stopping.max_wait_s (MaxWaitTimeInSeconds): stopped"
    ),
    FailureKind.CHAIN_DEAD_LETTER: Policy(False, Blame.NONE, meaning="the restart decision could not be delivered"),
}

STOPPED_ON_REQUEST = "stopped on request"  # the message of every user.stop reason


@dataclass(frozen=True)
class StopLimit:
    """A StoppingCondition limit that stops a job when it runs out: SageMaker's final
    SecondaryStatus of a job it stopped for it, and that status's StatusMessage."""

    kind: FailureKind
    secondary_status: SecondaryStatus
    message: str


# The kinds that end a job Stopped (not Failed) without a user's stop request, by kind.
STOP_LIMITS: dict[str, StopLimit] = {
    FailureKind.MAX_RUNTIME_EXCEEDED: StopLimit(
        FailureKind.MAX_RUNTIME_EXCEEDED,
        SecondaryStatus.MAX_RUNTIME_EXCEEDED,
        "Training job runtime exceeded MaxRuntimeInSeconds provided",
    ),
    FailureKind.MAX_WAIT_EXCEEDED: StopLimit(
        FailureKind.MAX_WAIT_EXCEEDED,
        SecondaryStatus.MAX_WAIT_TIME_EXCEEDED,
        "Training job wait time exceeded MaxWaitTimeInSeconds provided",
    ),
}


def stop_limit(reason: dict[str, Any] | None) -> StopLimit | None:
    """The limit a job was stopped for, from its reason (None: not stopped for a limit)."""
    return STOP_LIMITS.get(str((reason or {}).get("kind") or ""))


class NodeBlame(TypedDict, total=False):
    """One node blamed for one failed attempt, as chaining records it (`POST .../blames`)."""

    host: str
    kind: str  # FailureKind of the attempt's failure
    rule: str  # BlameRule
    why: str  # one line for people (`aerie describe`)
    evidence: dict[str, Any]  # the per-node facts the rule compared


def policy(kind: str | None) -> Policy | None:
    """The policy of a failure kind, or None for a kind nobody defined (not retried)."""
    try:
        return POLICIES[FailureKind(kind)]
    except ValueError:
        return None


class FailureReason(TypedDict, total=False):
    """Why an attempt, node or job ended; stored as JSON on attempts, nodes and jobs."""

    kind: str  # FailureKind
    message: str
    host: str  # the node the failure is attributed to, when one is
    rank: int
    exit_code: int
    signal: int | None
    at: float  # when it happened (UNIX seconds), which may precede its detection
    evidence: dict[str, Any]
    retry_exhausted: bool
    attempts: int


def reason(kind: FailureKind, message: str, **fields: Any) -> dict[str, Any]:
    """A failure reason as stored and sent: `{"kind", "message", ...}` with the kind as a plain string."""
    return {"kind": kind.value, "message": message, **fields}


def stopped_on_request(**fields: Any) -> dict[str, Any]:
    return reason(FailureKind.USER_STOP, STOPPED_ON_REQUEST, **fields)
