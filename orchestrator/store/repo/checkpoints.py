"""Recorded checkpoints: fenced commits (only the current attempt's count) and their states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, exists, func, select, update
from sqlalchemy.orm import Session, aliased

from aerie_contracts import DetailType
from aerie_contracts import metrics as metric_keys
from aerie_contracts.checkpoints import CheckpointTier, expired_memory, tier_of_uri
from aerie_contracts.failures import FailureKind
from aerie_contracts.states import ATTEMPT_ACTIVE, ATTEMPT_TERMINAL, CheckpointState
from orchestrator.store.models import (
    Attempt,
    Checkpoint,
    Job,
    Verdict,
    now,
)
from orchestrator.store.repo.outbox import emit

# --- checkpoints ------------------------------------------------------------------------------------


class Superseded(RuntimeError):
    """The attempt is no longer its job's current one: nothing it commits counts (fencing)."""


def hold_current_attempt(s: Session, attempt: Attempt) -> bool:
    """Whether `attempt` is still its job's current attempt (active, and no newer one exists).

    Checked by a conditional UPDATE of the attempt's own row rather than a read: the row then stays
    locked until the caller's transaction ends, so the controller cannot end the attempt between
    this check and what the caller writes next (a PostgreSQL row lock; SQLite's single writer). An
    attempt ended first is seen ended (PostgreSQL re-reads the row the UPDATE waited for)."""
    newer = aliased(Attempt)
    # An UPDATE's result is a CursorResult (its rowcount); Session.execute is typed for any statement.
    result = cast(
        CursorResult[Any],
        s.execute(
            update(Attempt)
            .where(
                Attempt.id == attempt.id,
                Attempt.state.in_([str(x) for x in ATTEMPT_ACTIVE]),
                ~exists().where(newer.job_id == Attempt.job_id, newer.number > Attempt.number),
            )
            .values(state=Attempt.state)
            .execution_options(synchronize_session=False),
        ),
    )
    return result.rowcount == 1


def _tier(uri: str, tier: str | None) -> CheckpointTier:
    """The tier a report names, checked against its URI (mem:// is the memory tier's scheme)."""
    from_uri = tier_of_uri(uri)
    if tier is None:
        return from_uri
    try:
        named = CheckpointTier(tier)
    except ValueError:
        raise ValueError(f"tier {tier!r}: one of {', '.join(t.value for t in CheckpointTier)}") from None
    if named != from_uri:
        raise ValueError(f"tier {tier!r} does not match the URI {uri!r}")
    return named


# The seconds a `checkpoint_committed` line carries (aerie_contracts.metrics).
TIMING_KEYS = (metric_keys.SAVE_S, metric_keys.STALL_S, metric_keys.UPLOAD_S)


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9


def _ranks(meta: dict[str, Any]) -> set[int]:
    ranks = meta.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ValueError("a memory checkpoint's report lists the ranks it holds (meta.ranks: [int])")
    return set(ranks)


def _world_size(meta: dict[str, Any]) -> int:
    size = meta.get("world_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError("a memory checkpoint's report names the world size (meta.world_size: int >= 1)")
    return size


def record_checkpoint(
    s: Session, attempt: Attempt, step: int, uri: str, meta: dict[str, Any], *, tier: str | None = None
) -> Checkpoint | None:
    """Record a committed checkpoint as good; None if it is known already. Raises `Superseded`
    when its attempt is no longer the job's current one: a zombie's commit never becomes good.

    A memory-tier checkpoint is reported by each node once both copies of its ranks' snapshots
    are complete (agent/memckpt/ring.py): the row is `incomplete` until the reports' `ranks`
    cover `world_size`, then `good` (returned once, when it becomes good)."""
    kind = _tier(uri, tier)
    if kind == CheckpointTier.MEMORY:
        return _record_memory(s, attempt, step, uri, meta)
    exists = s.scalars(select(Checkpoint).where(Checkpoint.job_id == attempt.job_id, Checkpoint.uri == uri)).first()
    if exists:
        # Already known: reported twice, by two ranks or on a re-sent line. The trainer's own commit
        # (routes/checkpoints.py) comes first and without timings; the agent's report of the same
        # commit line brings them (the goodput ledger, the advice and /metrics read `save_s`).
        timing = {k: meta[k] for k in TIMING_KEYS if k not in (exists.meta or {}) and _seconds(meta.get(k))}
        if timing and exists.attempt_id == attempt.id:
            exists.meta = {**(exists.meta or {}), **timing}  # a new dict: the JSON column sees the change
        return None
    if not hold_current_attempt(s, attempt):
        raise Superseded(f"attempt {attempt.id} is no longer its job's current attempt: {uri} is not recorded")
    stalled = select(Verdict.id).where(
        Verdict.attempt_id == attempt.id, Verdict.kind == FailureKind.CHECKPOINT_STALLED.value
    )
    if s.scalars(stalled).first() is not None:
        # An agent gave up on this attempt's save (its upload ran past the learned limit): the
        # save is abandoned, so a commit that arrives after all must not become good.
        raise Superseded(
            f"attempt {attempt.id} abandoned its checkpoint save (checkpoint.stalled): {uri} is not recorded"
        )
    size = meta.get("size_bytes")
    ckpt = Checkpoint(
        job_id=attempt.job_id,
        attempt_id=attempt.id,
        step=step,
        uri=uri,
        size_bytes=size if isinstance(size, int) and not isinstance(size, bool) and 0 <= size < 2**63 else None,
        meta=meta,
        state=CheckpointState.GOOD,
    )
    s.add(ckpt)
    emit(s, attempt.job, DetailType.CHECKPOINT_COMMITTED, {"attempt_id": attempt.id, "step": step, "uri": uri})
    s.flush()
    expire_memory_checkpoints(s, attempt.job)  # memory checkpoints older than this one are of no use now
    return ckpt


def _record_memory(s: Session, attempt: Attempt, step: int, uri: str, meta: dict[str, Any]) -> Checkpoint | None:
    ranks, world = _ranks(meta), _world_size(meta)
    if any(r < 0 or r >= world for r in ranks):
        raise ValueError(f"ranks {sorted(ranks)} outside a world of {world}")
    if not hold_current_attempt(s, attempt):
        raise Superseded(f"attempt {attempt.id} is no longer its job's current attempt: {uri} is not recorded")
    row = s.scalars(select(Checkpoint).where(Checkpoint.job_id == attempt.job_id, Checkpoint.uri == uri)).first()
    node = str(meta.get("node", ""))
    size = meta.get("size_bytes") if isinstance(meta.get("size_bytes"), int) else 0
    if row is None:
        row = Checkpoint(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            step=step,
            uri=uri,
            size_bytes=0,
            meta={"world_size": world, "ranks": [], "nodes": {}},
            state=CheckpointState.INCOMPLETE,
            tier=CheckpointTier.MEMORY.value,
        )
        s.add(row)
    if row.state != CheckpointState.INCOMPLETE:
        return None  # good already (a re-sent report), or bad / deleted since
    held = set(row.meta.get("ranks", [])) | ranks
    nodes = dict(row.meta.get("nodes", {}))
    nodes[node] = {"ranks": sorted(ranks), "replica_node": meta.get("replica_node"), "size_bytes": size}
    # A new dict: the JSON column sees the change.
    row.meta = {"world_size": world, "ranks": sorted(held), "nodes": nodes}
    row.size_bytes = sum(int(n.get("size_bytes") or 0) for n in nodes.values())
    if held >= set(range(world)):
        row.state, row.state_at = CheckpointState.GOOD, now()
        # No `checkpoint committed` event: its handlers (evaluation, GC) read S3 checkpoints.
        s.flush()
        expire_memory_checkpoints(s, attempt.job)  # the agents dropped the older snapshots
        return row
    return None


def list_checkpoints(s: Session, job: Job) -> Sequence[Checkpoint]:
    return s.scalars(
        select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step, Checkpoint.id)
    ).all()


def expire_memory_checkpoints(
    s: Session, job: Job, *, job_over: bool = False, lost_attempts: Sequence[str] = ()
) -> list[Checkpoint]:
    """Mark `deleted` (with the reason) the job's memory checkpoints no restart can use any more
    (`aerie_contracts.checkpoints.expired_memory`); returns the rows changed."""
    # Only the memory rows still live (few: the expired ones are `deleted`) and the newest good S3
    # step are read: this runs each time a memory checkpoint becomes good.
    live = [CheckpointState.GOOD.value, CheckpointState.INCOMPLETE.value]
    memory = CheckpointTier.MEMORY.value
    rows = s.scalars(
        select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.tier == memory, Checkpoint.state.in_(live))
    ).all()
    if not rows:
        return []
    durable = s.scalar(
        select(func.max(Checkpoint.step)).where(
            Checkpoint.job_id == job.id, Checkpoint.tier != memory, Checkpoint.state == CheckpointState.GOOD.value
        )
    )
    known = [{"uri": r.uri, "step": r.step, "state": r.state, "tier": r.tier, "attempt_id": r.attempt_id} for r in rows]
    if durable is not None:
        known.append({"uri": "", "step": durable, "state": CheckpointState.GOOD.value, "tier": CheckpointTier.S3.value})
    ended = {a.id for a in job.attempts if a.state in ATTEMPT_TERMINAL}
    gone = expired_memory(known, job_over=job_over, ended_attempts=ended, lost_attempts=lost_attempts)
    changed = []
    for row in rows:
        if row.uri in gone:
            row.state, row.reason, row.state_at = CheckpointState.DELETED.value, gone[row.uri], now()
            changed.append(row)
    return changed


# Where a recorded checkpoint may go: `bad` is final but for GC, `deleted` is final. (A memory
# checkpoint still `incomplete` may go too: its attempt ended, or the job did.)
_CHECKPOINT_NEXT = {
    CheckpointState.BAD: {CheckpointState.GOOD},
    CheckpointState.DELETED: {CheckpointState.GOOD, CheckpointState.BAD, CheckpointState.INCOMPLETE},
}


def set_checkpoint_state(s: Session, job: Job, uris: list[str], state: str, reason: str = "") -> list[Checkpoint]:
    """Move the job's checkpoints at `uris` to `bad` or `deleted` (others and unknown URIs are left
    alone: a repeated report changes nothing). Returns the rows changed."""
    allowed_from = _CHECKPOINT_NEXT[CheckpointState(state)]
    wanted = {u.rstrip("/") for u in uris}
    rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.uri.in_(wanted))).all()
    changed = []
    for row in rows:
        if row.state in allowed_from:
            row.state, row.reason, row.state_at = str(state), reason or None, now()
            changed.append(row)
    return changed
