"""SQLAlchemy 2 models: the control plane's durable state.

Times are UNIX seconds (floats) so SQLite and PostgreSQL sort and compare them the same way.
Every state change goes with an `Event` row written in the same transaction (the outbox).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from aerie_contracts.checkpoints import CheckpointTier
from aerie_contracts.states import NodeState, OutboxStatus


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True, default="default")
    name: Mapped[str] = mapped_column(String(63), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    backend: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now, onupdate=now)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    attempts: Mapped[list[Attempt]] = relationship(back_populates="job", order_by="Attempt.number")


class Attempt(Base):
    __tablename__ = "attempts"
    # One attempt per (job, number): a duplicated restart decision fails here, not later.
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempt_number"),)

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    resume_from: Mapped[str | None] = mapped_column(Text, nullable=True)
    exclude_nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Why this attempt exists: the failure of the previous one, as chaining saw it.
    cause: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    job: Mapped[Job] = relationship(back_populates="attempts")
    nodes: Mapped[list[Node]] = relationship(back_populates="attempt", order_by="Node.host")


class Node(Base):
    __tablename__ = "nodes"

    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default=NodeState.STARTING.value)
    last_heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    exit: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The node's pre-flight result for this attempt (aerie_contracts.preflight.PreflightResult).
    preflight: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    attempt: Mapped[Attempt] = relationship(back_populates="nodes")


class Verdict(Base):
    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    t: Mapped[float] = mapped_column(Float, default=now)


class NodeBlame(Base):
    """A node blamed for a failed attempt (by chaining, from the attempt's evidence: recovery/blame.py).

    Blame counts per job: `retry.exclude_after_blames` active rows exclude the host from the
    job's next attempts. A row stays as history; it stops counting once `cleared_at` is set, which
    `repo.clear_blames` does when the node has proven itself again (not called yet: a passed pre-flight
    check does not clear, see docs/architecture.md, "Blame").
    One row per (attempt, host): a redelivered failure records nothing twice."""

    __tablename__ = "node_blames"
    __table_args__ = (UniqueConstraint("attempt_id", "host", name="uq_blame_attempt_host"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    host: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(64))  # the attempt's failure kind
    rule: Mapped[str] = mapped_column(String(32))  # aerie_contracts.failures.BlameRule
    why: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    cleared_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cleared_by: Mapped[str | None] = mapped_column(String(128), nullable=True)  # e.g. "preflight:<attempt id>"


class Event(Base):
    """The outbox: written with the state change it describes, delivered at least once."""

    __tablename__ = "events"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str] = mapped_column(String(80), index=True)
    tenant: Mapped[str] = mapped_column(String(64), default="default")
    detail_type: Mapped[str] = mapped_column(String(64), index=True)
    source: Mapped[str] = mapped_column(String(64), default="aerie.orchestrator")
    time: Mapped[float] = mapped_column(Float, default=now)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=OutboxStatus.PENDING, index=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "uri", name="uq_checkpoint_uri"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    # A CheckpointState: `good` when recorded (only from the job's current attempt), then `bad`
    # (verification or a restore failed) or `deleted` (GC), with why and when in reason/state_at.
    state: Mapped[str] = mapped_column(String(16), default="good")
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    state_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # An aerie_contracts.checkpoints.CheckpointTier: `s3` (durable) or `memory` (node shared
    # memory + a peer replica; `incomplete` until the nodes' reports cover every rank).
    tier: Mapped[str] = mapped_column(
        String(16), default=CheckpointTier.S3.value, server_default=CheckpointTier.S3.value
    )


class Token(Base):
    """API credentials, stored as SHA-256 hashes: a leaked database leaks no usable token."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # admin | agent | service
    tenant: Mapped[str] = mapped_column(String(64), default="default")
    attempt_id: Mapped[str | None] = mapped_column(String(80), nullable=True, index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The token's AWS access key id when it was made for SigV4 (`aerie token create --aws`); the
    # secret key is derived from it with the server's key, never stored (sagemaker_api/sigv4.py).
    access_key_id: Mapped[str | None] = mapped_column(String(32), unique=True, index=True, nullable=True)


class EvalSample(Base):
    """One prompt + answer of one checkpoint, posted once to Slack for people to rate.

    The (job, checkpoint, prompt) unique key is what makes posting idempotent: a redelivered
    "checkpoint committed" event finds the row, and `slack_ts` says it was posted already.
    """

    __tablename__ = "eval_samples"
    __table_args__ = (UniqueConstraint("job_id", "checkpoint_uri", "prompt_index", name="uq_eval_sample"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    checkpoint_uri: Mapped[str] = mapped_column(Text)
    step: Mapped[int] = mapped_column(Integer)
    prompt_index: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # tokens, loss, sampling settings
    slack_channel: Mapped[str | None] = mapped_column(String(128), nullable=True)
    slack_ts: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Who is posting it now (a delivery's id) and since when: one poster at a time.
    claim: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    posted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Rating(Base):
    """One person's rating of one sample; rating again replaces it (unique per sample and user)."""

    __tablename__ = "ratings"
    __table_args__ = (UniqueConstraint("sample_id", "user_id", name="uq_rating_user"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sample_id: Mapped[str] = mapped_column(ForeignKey("eval_samples.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(128), default="")
    score: Mapped[int | None] = mapped_column(Integer, nullable=True)  # 1..5; None: only flagged so far
    hallucination: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class MetricPoint(Base):
    """One rank-0 training step of one attempt, as the agent forwarded it from the metrics stream.

    Fixed columns (not a JSON blob) so a 100,000-step curve is read and downsampled cheaply. One
    row per (attempt, step): a re-sent batch changes nothing."""

    __tablename__ = "metric_points"
    __table_args__ = (UniqueConstraint("attempt_id", "step", name="uq_metric_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[str] = mapped_column(String(80))
    attempt_number: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    t: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    grad_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    lr: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    mfu: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_dollar: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebSession(Base):
    """A dashboard login: the cookie holds a random id, stored here hashed, bound to the API token
    it was opened with (revoking the token ends its sessions). The token itself is never stored."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires_at: Mapped[float] = mapped_column(Float)


class SageMakerTrainingJob(Base):
    """A job created through the SageMaker-compatible endpoint: the name it was created with, its
    ARN (unique per tenant: SageMaker's names are unique per account and region, and an ARN holds
    the region and the lower-cased name; each tenant is one account), the request exactly
    as sent (DescribeTrainingJob returns every field of it), its tags (AddTags/DeleteTags change
    them) and what Aerie could not honour on the chosen backend."""

    __tablename__ = "sagemaker_training_jobs"
    __table_args__ = (UniqueConstraint("tenant", "arn", name="uq_sagemaker_job_arn"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(63))
    arn: Mapped[str] = mapped_column(String(256))
    region: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    tags: Mapped[list[Any]] = mapped_column(JSON, default=list)
    warnings: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[float] = mapped_column(Float, default=now)

    job: Mapped[Job] = relationship()


def columns(row: Any, *names: str) -> dict[str, Any]:
    """The named columns of a stored row, as keyword arguments of a view with the same field names
    (the views name what they copy as it is; what they compute or rename stays spelled out)."""
    return {name: getattr(row, name) for name in names}
