"""Response and request bodies of the API (the job spec itself is `orchestrator.spec.JobSpec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The largest integer the stores hold (SQLite and PostgreSQL BIGINT): bounds every integer
# query parameter, so an absurd one gets a 422 rather than an overflow deep in a driver.
MAX_DB_INT = 2**63 - 1


class NodeOut(BaseModel):
    host: str
    state: str
    last_heartbeat_at: float | None = None
    summary: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    preflight: dict[str, Any] | None = None  # aerie_contracts.preflight.PreflightResult, once reported


class VerdictOut(BaseModel):
    attempt_id: str
    host: str
    kind: str
    message: str
    t: float
    evidence: dict[str, Any] = Field(default_factory=dict)


class AttemptOut(BaseModel):
    id: str
    number: int
    state: str
    reason: dict[str, Any] | None = None
    exit_code: int | None = None
    resume_from: str | None = None
    exclude_nodes: list[str] = Field(default_factory=list)
    cause: dict[str, Any] | None = None
    last_step: int | None = None
    resumed_step: int | None = None
    steps_lost: int | None = None
    time_to_resume_s: float | None = None
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    nodes: list[NodeOut] = Field(default_factory=list)
    # Hot spares (resources.spare_nodes) waiting beside the attempt's nodes, without ranks.
    spares: list[str] = Field(default_factory=list)
    # Each spare's own pre-flight result (aerie_contracts.preflight.PreflightResult), by host.
    spare_preflight: dict[str, dict[str, Any]] = Field(default_factory=dict)


class JobOut(BaseModel):
    id: str
    name: str
    tenant: str
    state: str
    backend: str
    reason: dict[str, Any] | None = None
    created_at: float
    updated_at: float
    ended_at: float | None = None
    attempts: int = 0
    spec: dict[str, Any] | None = None


class BlameOut(BaseModel):
    """A node chaining blamed for a failed attempt; `cleared_at` set: it no longer counts."""

    attempt_id: str
    host: str
    kind: str
    rule: str
    why: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    cleared_at: float | None = None
    cleared_by: str | None = None


class JobDetail(JobOut):
    attempt_list: list[AttemptOut] = Field(default_factory=list)
    verdicts: list[VerdictOut] = Field(default_factory=list)
    blames: list[BlameOut] = Field(default_factory=list)


class EventOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    seq: int
    status: str
    deliveries: int
    event: dict[str, Any]


class CheckpointOut(BaseModel):
    step: int
    uri: str
    state: str  # aerie_contracts.states.CheckpointState: good, bad or deleted once recorded
    attempt_id: str | None = None
    size_bytes: int | None = None
    created_at: float
    meta: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None  # why it is bad or deleted
    state_at: float | None = None  # when it left `good`
    tier: str = "s3"  # aerie_contracts.checkpoints.CheckpointTier


class LogsOut(BaseModel):
    attempt: int | None
    nodes: dict[str, dict[str, Any]]


class HeartbeatOut(BaseModel):
    ok: bool = True
    stop: bool = False
    # The job's newest good memory checkpoint step (tier `memory`), None if none: the nodes never
    # prune its snapshots (aerie_contracts.memckpt.HEARTBEAT_GOOD_STEP names this field for them).
    memory_good_step: int | None = None


class PreflightIn(BaseModel):
    """A node's pre-flight result (aerie_contracts.preflight.PreflightResult); extra keys are kept."""

    model_config = ConfigDict(extra="allow")

    passed: bool
    checks: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    elapsed_s: float | None = None
    budget_s: float | None = None
    t: float | None = None
    faults: list[str] = Field(default_factory=list, max_length=16)


class PreflightOut(BaseModel):
    """The attempt's pre-flight decision (aerie_contracts.preflight.Decision): `start` once every
    node passed, `abort` once one failed (`failed` names them) or the attempt ended, else `wait`."""

    action: str
    why: str = ""
    failed: list[str] = Field(default_factory=list)


class NextOut(BaseModel):
    """What an agent whose worker group ended does next (aerie_contracts.restarts.NextAction).
    With `restart`: the in-place attempt it now serves, that attempt's agent token (scoped to it,
    minted for this node), where its ranks resume from, its rendezvous port and its replication key."""

    action: str
    why: str = ""
    attempt_id: str | None = None
    attempt_number: int | None = None
    token: str | None = None
    resume_from: str | None = None
    # With a memory resume point: the durable checkpoint the ranks fall back to (None: scratch).
    resume_fallback: str | None = None
    memory_nodes: dict[str, Any] | None = None  # who wrote which ranks' snapshots, who holds the replicas
    master_port: int | None = None  # where the backend moved the rendezvous (None: unchanged)
    # Node rank 0's address in this attempt, as the backend knows it: a hot spare may hold rank 0's
    # slot now (None: unchanged).
    master_addr: str | None = None
    # The in-place attempt's replication key (aerie_contracts.memckpt.HANDLE_KEY; None: no memory tier).
    memckpt_key: str | None = None
    # The attempt's nodes in rank order: a hot spare may have taken a failed node's slot.
    hosts: list[str] | None = None
    # The memory tier's endpoints ({host: addr:port}) when the backend added nodes (a new hot spare).
    memory_peers: dict[str, str] | None = None
    # Whether the asking attempt is over (ended, or a successor exists): a node whose ranks stalled
    # asks, to stop them as soon as a failure elsewhere ended the attempt (agent/supervisor.py).
    attempt_over: bool = False


class VerdictIn(BaseModel):
    kind: str = Field(pattern=r"^[a-z]+(\.[a-z_]+)+$", max_length=64)
    message: str = Field(default="", max_length=4000)
    evidence: dict[str, Any] = Field(default_factory=dict)
    t: float | None = None
    host: str | None = None


class ExitIn(BaseModel):
    exit_code: int
    reason: dict[str, Any] | None = None
    t: float | None = None
    host: str | None = None


class CheckpointIn(BaseModel):
    step: int = Field(ge=0)
    uri: str = Field(min_length=1, max_length=2048)
    meta: dict[str, Any] = Field(default_factory=dict)
    # aerie_contracts.checkpoints.CheckpointTier; absent: read from the URI (mem:// is memory).
    tier: str | None = Field(default=None, max_length=16)


class MetricsIn(BaseModel):
    """A batch of rank-0 training-step records from the metrics stream (see docs/architecture.md)."""

    records: list[dict[str, Any]] = Field(default_factory=list, max_length=5000)


class RestartIn(BaseModel):
    number: int = Field(ge=2)
    resume_from: str | None = Field(default=None, max_length=2048)
    exclude_nodes: list[str] = Field(default_factory=list, max_length=4096)
    cause: dict[str, Any] = Field(default_factory=dict)


class BlameIn(BaseModel):
    """One node blamed for the attempt (`aerie_contracts.failures.NodeBlame`)."""

    host: str = Field(min_length=1, max_length=128)
    kind: str = Field(pattern=r"^[a-z]+(\.[a-z_]+)+$", max_length=64)
    rule: str = Field(pattern=r"^[a-z_]+$", max_length=32)
    why: str = Field(default="", max_length=2000)
    evidence: dict[str, Any] = Field(default_factory=dict)


class BlamesIn(BaseModel):
    blames: list[BlameIn] = Field(default_factory=list, max_length=4096)


class FailIn(BaseModel):
    reason: dict[str, Any] = Field(default_factory=dict)


class ErrorOut(BaseModel):
    detail: Any


# What every authenticated route may answer besides its success (documented in OpenAPI).
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Malformed request (e.g. a body that is not JSON)"},
    401: {"model": ErrorOut, "description": "Missing, invalid, expired or revoked token"},
    403: {"model": ErrorOut, "description": "The token may not do this"},
    404: {"model": ErrorOut, "description": "No such object (in your tenant)"},
    413: {"model": ErrorOut, "description": "Request body too large"},
    429: {"model": ErrorOut, "description": "Too many writes with this token (see Retry-After)"},
}


class AttemptViewOut(BaseModel):
    """An attempt as its own nodes see it: is it still its job's current one (fencing)?"""

    id: str
    job_id: str
    number: int
    state: str
    current: bool


class CheckpointBadIn(BaseModel):
    uri: str = Field(min_length=1, max_length=2048)
    reason: str = Field(default="", max_length=1000)


class CheckpointStateIn(BaseModel):
    """What a handler found out about recorded checkpoints: verification failed, or GC deleted them."""

    uris: list[str] = Field(min_length=1, max_length=1000)
    state: Literal["bad", "deleted"]
    reason: str = Field(default="", max_length=1000)


class CheckpointStateOut(BaseModel):
    changed: list[str]


class GoodputSegmentOut(BaseModel):
    start: float
    end: float
    category: str  # aerie_contracts.goodput.Category
    attempt: int | None = None


class GoodputFaultOut(BaseModel):
    attempt: int
    kind: str | None = None
    last_step: int
    last_step_t: float
    verdict_t: float | None = None
    detection_s: float
    detected_t: float | None = None  # the verdict, or the attempt's end without one
    restart_mode: str | None = None  # aerie_contracts.restarts.RestartMode of the attempt after
    recovery_s: float | None = None  # detected_t → the attempt after's first step (wall seconds)
    resumed_step: int | None = None
    redone_steps: int = 0
    redone_s: float = 0.0


class GoodputAdviceOut(BaseModel):
    """Checkpoint-interval advice (Young–Daly) for one of the job's checkpoint tiers."""

    tier: Literal["s3", "memory"]  # aerie_contracts.checkpoints.CheckpointTier
    failures: str  # which failures the tier's MTBF counts
    save_stall_s: float
    mtbf_s: float
    mtbf_source: Literal["fleet", "setting"]
    step_s: float
    current_every_steps: int | None = None
    current_interval_s: float | None = None
    advised_interval_s: float
    advised_every_steps: int
    current_badput: float | None = None
    advised_badput: float


class GoodputOut(BaseModel):
    """Where a job's paid time went: node-seconds per category (aerie_contracts.goodput)."""

    job_id: str
    name: str
    state: str
    nodes: int
    start: float
    end: float
    wall_s: float
    node_seconds: float
    goodput: float
    categories: dict[str, float]
    segments: list[GoodputSegmentOut]
    faults: list[GoodputFaultOut]
    advice: list[GoodputAdviceOut] = []  # one per tier measured so far
