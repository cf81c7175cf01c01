"""The one data-access layer: every read and state change the API and controller make.

State changes and their events are written together here, inside the caller's transaction, so
an event exists if and only if its change was committed (the transactional outbox).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased, selectinload

from aerie_contracts import DetailType
from aerie_contracts.events import SEQ
from aerie_contracts.failures import FailureKind
from aerie_contracts.states import ATTEMPT_ACTIVE, CheckpointState
from orchestrator.store.models import (
    Attempt,
    Checkpoint,
    EvalSample,
    Event,
    Job,
    MetricPoint,
    Node,
    NodeBlame,
    Rating,
    SageMakerTrainingJob,
    Token,
    Verdict,
    WebSession,
    now,
)

SOURCE = "aerie.orchestrator"
JOB_STATE_CHANGE = DetailType.JOB_STATE_CHANGE
ATTEMPT_STATE_CHANGE = DetailType.ATTEMPT_STATE_CHANGE
CHECKPOINT_COMMITTED = DetailType.CHECKPOINT_COMMITTED
VERDICT_RAISED = DetailType.VERDICT_RAISED

JOB_TERMINAL = {"Completed", "Failed", "Stopped"}
ATTEMPT_TERMINAL = {"Completed", "Failed", "Stopped"}


class NotFound(LookupError):
    pass


# --- events --------------------------------------------------------------------------------------


def emit(s: Session, job: Job, detail_type: str, detail: dict[str, Any]) -> Event:
    event = Event(
        id=str(uuid.uuid4()),
        job_id=job.id,
        tenant=job.tenant,
        detail_type=detail_type,
        source=SOURCE,
        time=now(),
        detail={"job_id": job.id, "job_name": job.name, **detail},
        status="pending",
    )
    s.add(event)
    return event


def eventbridge(event: Event) -> dict[str, Any]:
    """The event as EventBridge delivers it, so one handler runs in Lambda and in-process."""
    from datetime import datetime, timezone

    return {
        "version": "0",
        "id": event.id,
        "detail-type": event.detail_type,
        "source": event.source,
        "account": "000000000000",
        "time": datetime.fromtimestamp(event.time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "local",
        "resources": [f"aerie:job/{event.job_id}"],
        # The outbox sequence number: the idempotency key a consumer dedupes on (aerie_contracts.events.SEQ).
        "detail": {**event.detail, SEQ: event.seq},
    }


def list_events(s: Session, job: Job, after: int = 0, limit: int | None = None) -> Sequence[Event]:
    q = select(Event).where(Event.job_id == job.id, Event.seq > after).order_by(Event.seq)
    return s.scalars(q.limit(limit) if limit else q).all()


# --- jobs ----------------------------------------------------------------------------------------


def create_job(s: Session, spec: dict[str, Any], tenant: str) -> Job:
    job = Job(
        id=f"{spec['name'][:50]}-{secrets.token_hex(3)}",
        tenant=tenant,
        name=spec["name"],
        spec=spec,
        backend=spec.get("backend", "local"),
        state="Submitted",
    )
    s.add(job)
    s.flush()
    emit(s, job, JOB_STATE_CHANGE, {"state": "Submitted"})
    return job


def get_job(s: Session, tenant: str, ref: str) -> Job:
    """A job by id, or by name (the newest of that name), within the tenant."""
    job = s.scalars(
        select(Job)
        .where(Job.tenant == tenant, or_(Job.id == ref, Job.name == ref))
        .order_by((Job.id == ref).desc(), Job.created_at.desc())
        .limit(1)
    ).first()
    if job is None:
        raise NotFound(f"no job {ref!r}")
    return job


def list_jobs(
    s: Session,
    tenant: str,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
    name: str | None = None,
    backend: str | None = None,
    with_attempts: bool = False,
) -> Sequence[Job]:
    q = select(Job).where(Job.tenant == tenant)
    if state:
        q = q.where(Job.state == state)
    if name:
        q = q.where(Job.name.contains(name, autoescape=True))
    if backend:
        q = q.where(Job.backend == backend)
    if with_attempts:  # a jobs list shows attempts and nodes: two more queries, not two per job
        q = q.options(selectinload(Job.attempts).selectinload(Attempt.nodes))
    return s.scalars(q.order_by(Job.created_at.desc()).limit(limit).offset(offset)).all()


def list_jobs_in_state(s: Session, state: str) -> Sequence[Job]:
    return s.scalars(select(Job).where(Job.state == state).order_by(Job.created_at)).all()


def jobs_stopping(s: Session) -> Sequence[Job]:
    return s.scalars(select(Job).where(Job.stop_requested.is_(True), Job.state.not_in(JOB_TERMINAL))).all()


def set_job_state(s: Session, job: Job, state: str, reason: dict[str, Any] | None = None) -> None:
    if job.state == state:
        return
    job.state = state
    if reason is not None:
        job.reason = reason
    if state in JOB_TERMINAL:
        job.ended_at = now()
    detail: dict[str, Any] = {"state": state}
    if reason is not None:
        detail["reason"] = reason
    emit(s, job, JOB_STATE_CHANGE, detail)


# --- attempts ------------------------------------------------------------------------------------


def create_attempt(
    s: Session, job: Job, number: int, resume_from: str | None = None, exclude_nodes: list[str] | None = None
) -> Attempt:
    attempt = Attempt(
        id=f"{job.id}-a{number}",
        job_id=job.id,
        number=number,
        state="Pending",
        resume_from=resume_from,
        exclude_nodes=exclude_nodes or [],
    )
    s.add(attempt)
    s.flush()  # the (job, number) unique constraint fires here for a duplicate
    return attempt


def get_attempt(s: Session, attempt_id: str) -> Attempt:
    attempt = s.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt {attempt_id!r}")
    return attempt


def attempts_in(s: Session, states: set[str]) -> Sequence[Attempt]:
    return s.scalars(select(Attempt).where(Attempt.state.in_(states)).order_by(Attempt.created_at)).all()


def set_attempt_state(
    s: Session, attempt: Attempt, state: str, reason: dict[str, Any] | None = None, exit_code: int | None = None
) -> None:
    if attempt.state == state:
        return
    attempt.state = state
    if reason is not None:
        attempt.reason = reason
    if exit_code is not None:
        attempt.exit_code = exit_code
    if state == "Running":
        attempt.started_at = now()
    if state in ATTEMPT_TERMINAL:
        attempt.ended_at = now()
    if state in {"Launching"}:
        return  # internal bookkeeping, not an event users care about
    detail: dict[str, Any] = {"attempt_id": attempt.id, "attempt": attempt.number, "state": state}
    if reason is not None:
        detail["reason"] = reason
    if exit_code is not None:
        detail["exit_code"] = exit_code
    if attempt.resume_from:
        detail["resume_from"] = attempt.resume_from
    emit(s, attempt.job, ATTEMPT_STATE_CHANGE, detail)


# --- nodes and verdicts --------------------------------------------------------------------------


def node(s: Session, attempt: Attempt, host: str) -> Node:
    row = s.get(Node, (attempt.id, host))
    if row is None:
        row = Node(attempt_id=attempt.id, host=host, state="Starting")
        s.add(row)
    return row


def record_heartbeat(s: Session, attempt: Attempt, host: str, summary: dict[str, Any]) -> Node:
    row = node(s, attempt, host)
    row.last_heartbeat_at = now()
    row.summary = summary
    if row.state == "Starting":
        row.state = "Running"
    return row


def record_verdict(
    s: Session, attempt: Attempt, host: str, kind: str, message: str, evidence: dict[str, Any]
) -> Verdict:
    verdict = Verdict(attempt_id=attempt.id, host=host, kind=kind, message=message, evidence=evidence)
    s.add(verdict)
    emit(
        s,
        attempt.job,
        VERDICT_RAISED,
        {
            "attempt_id": attempt.id,
            "attempt": attempt.number,
            "host": host,
            "kind": kind,
            "message": message,
        },
    )
    return verdict


def verdicts_of(s: Session, attempt_ids: list[str]) -> Sequence[Verdict]:
    return s.scalars(select(Verdict).where(Verdict.attempt_id.in_(attempt_ids)).order_by(Verdict.t)).all()


# --- node blame ----------------------------------------------------------------------------------


def record_blames(s: Session, attempt: Attempt, blames: list[dict[str, Any]]) -> None:
    """Chaining's blame of nodes for a failed attempt (`aerie_contracts.failures.NodeBlame` dicts).
    A host already blamed for this attempt keeps its first row: a redelivered failure counts once."""
    from sqlalchemy.exc import IntegrityError

    for b in blames:
        taken = select(NodeBlame.id).where(NodeBlame.attempt_id == attempt.id, NodeBlame.host == b["host"])
        if s.scalars(taken).first() is not None:
            continue
        row = NodeBlame(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            host=b["host"],
            kind=b["kind"],
            rule=b["rule"],
            why=b.get("why", ""),
            evidence=b.get("evidence") or {},
        )
        try:
            with s.begin_nested():
                s.add(row)
        except IntegrityError:  # a concurrent delivery recorded it first
            pass


def blames_of(s: Session, job: Job) -> Sequence[NodeBlame]:
    return s.scalars(select(NodeBlame).where(NodeBlame.job_id == job.id).order_by(NodeBlame.id)).all()


def clear_blames(s: Session, job: Job, host: str, by: str) -> int:
    """The node proved itself again (it passed the pre-launch health check): its blames in this job
    stop counting towards exclusion, and stay as history. Returns how many were cleared."""
    rows = [b for b in blames_of(s, job) if b.host == host and b.cleared_at is None]
    for b in rows:
        b.cleared_at, b.cleared_by = now(), by
    return len(rows)


# --- checkpoints ---------------------------------------------------------------------------------


class Superseded(RuntimeError):
    """The attempt is no longer its job's current one: nothing it commits counts (fencing)."""


def hold_current_attempt(s: Session, attempt: Attempt) -> bool:
    """Whether `attempt` is still its job's current attempt (active, and no newer one exists).

    Checked by a conditional UPDATE of the attempt's own row rather than a read: the row then stays
    locked until the caller's transaction ends, so the controller cannot end the attempt between
    this check and what the caller writes next (a PostgreSQL row lock; SQLite's single writer). An
    attempt ended first is seen ended (PostgreSQL re-reads the row the UPDATE waited for)."""
    newer = aliased(Attempt)
    result = s.execute(
        update(Attempt)
        .where(
            Attempt.id == attempt.id,
            Attempt.state.in_([str(x) for x in ATTEMPT_ACTIVE]),
            ~exists().where(newer.job_id == Attempt.job_id, newer.number > Attempt.number),
        )
        .values(state=Attempt.state)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def record_checkpoint(s: Session, attempt: Attempt, step: int, uri: str, meta: dict[str, Any]) -> Checkpoint | None:
    """Record a committed checkpoint as good; None if it is known already. Raises `Superseded`
    when its attempt is no longer the job's current one: a zombie's commit never becomes good."""
    exists = s.scalars(select(Checkpoint).where(Checkpoint.job_id == attempt.job_id, Checkpoint.uri == uri)).first()
    if exists:
        return None  # already known: reported twice, by two ranks or on a re-sent line
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
    emit(s, attempt.job, CHECKPOINT_COMMITTED, {"attempt_id": attempt.id, "step": step, "uri": uri})
    return ckpt


def list_checkpoints(s: Session, job: Job) -> Sequence[Checkpoint]:
    return s.scalars(
        select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step, Checkpoint.id)
    ).all()


# Where a recorded checkpoint may go: `bad` is final but for GC, `deleted` is final.
_CHECKPOINT_NEXT = {
    CheckpointState.BAD: {CheckpointState.GOOD},
    CheckpointState.DELETED: {CheckpointState.GOOD, CheckpointState.BAD},
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


# --- tokens --------------------------------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint_token(
    s: Session,
    kind: str,
    tenant: str = "default",
    attempt_id: str | None = None,
    name: str = "",
    token: str | None = None,
    expires_at: float | None = None,
    access_key_id: str | None = None,
) -> str:
    """Store a token's hash and return the token itself (shown once)."""
    token = token or f"aer_{kind[:3]}_{secrets.token_urlsafe(32)}"
    s.add(
        Token(
            token_hash=hash_token(token),
            kind=kind,
            tenant=tenant,
            attempt_id=attempt_id,
            name=name,
            expires_at=expires_at,
            access_key_id=access_key_id,
        )
    )
    return token


def list_tokens(s: Session, tenant: str | None) -> Sequence[Token]:
    """User and service tokens (agents' are per attempt and not listed); all tenants when None."""
    q = select(Token).where(Token.kind != "agent")
    if tenant is not None:
        q = q.where(Token.tenant == tenant)
    return s.scalars(q.order_by(Token.id)).all()


def revoke_token(s: Session, token_id: int, tenant: str | None) -> Token:
    row = s.get(Token, token_id)
    if row is None or (tenant is not None and row.tenant != tenant):
        raise NotFound(f"no token {token_id}")
    if row.revoked_at is None:
        row.revoked_at = now()
    return row


def find_token(s: Session, token: str) -> Token | None:
    row = s.scalars(select(Token).where(Token.token_hash == hash_token(token))).first()
    return row if _live(row) else None


def find_token_by_access_key(s: Session, access_key_id: str) -> Token | None:
    """The live token an AWS access key id belongs to (SigV4), or None."""
    row = s.scalars(select(Token).where(Token.access_key_id == access_key_id)).first()
    return row if _live(row) else None


def _live(token: Token | None) -> bool:
    """Neither revoked nor expired."""
    return token is not None and token.revoked_at is None and (token.expires_at is None or token.expires_at >= now())


# --- human eval: samples and ratings ---------------------------------------------------------------


def eval_sample_id(job_id: str, checkpoint_uri: str, prompt_index: int) -> str:
    """Deterministic, so every delivery of one checkpoint's event names the same samples."""
    digest = hashlib.sha256(f"{job_id}\n{checkpoint_uri}\n{prompt_index}".encode()).hexdigest()
    return f"es_{digest[:32]}"


def add_eval_samples(
    s: Session,
    job: Job,
    checkpoint_uri: str,
    step: int,
    attempt_id: str | None,
    answers: list[dict[str, Any]],
    channel: str | None,
) -> list[EvalSample]:
    """Store a checkpoint's samples; ones that exist already are kept as they are (first answer
    wins), so two deliveries racing here end up posting the same text. Returns all of them."""
    from sqlalchemy.exc import IntegrityError

    for item in answers:
        sid = eval_sample_id(job.id, checkpoint_uri, int(item["prompt_index"]))
        if s.get(EvalSample, sid) is not None:
            continue
        try:
            with s.begin_nested():
                s.add(
                    EvalSample(
                        id=sid,
                        job_id=job.id,
                        attempt_id=attempt_id,
                        checkpoint_uri=checkpoint_uri,
                        step=step,
                        prompt_index=int(item["prompt_index"]),
                        prompt=item["prompt"],
                        answer=item["answer"],
                        meta=item.get("meta") or {},
                        slack_channel=channel,
                    )
                )
        except IntegrityError:  # another delivery stored it first
            pass
    return list(eval_samples_of(s, job, checkpoint_uri))


def eval_samples_of(s: Session, job: Job, checkpoint_uri: str | None = None) -> Sequence[EvalSample]:
    q = select(EvalSample).where(EvalSample.job_id == job.id)
    if checkpoint_uri is not None:
        q = q.where(EvalSample.checkpoint_uri == checkpoint_uri)
    return s.scalars(q.order_by(EvalSample.step, EvalSample.prompt_index)).all()


def get_eval_sample(s: Session, sample_id: str) -> EvalSample:
    sample = s.get(EvalSample, sample_id)
    if sample is None:
        raise NotFound(f"no eval sample {sample_id!r}")
    return sample


def claim_eval_sample(s: Session, sample_id: str, claim: str, lease_s: float) -> str | None:
    """Take the right to post a sample: one atomic conditional UPDATE, so two deliveries never
    both post. Returns None (posted already, or someone else holds a fresh claim), "new", or
    "takeover" (a previous poster's claim expired: it may have posted before dying)."""
    from sqlalchemy import and_, update

    t = now()
    row = s.get(EvalSample, sample_id)
    if row is None:
        raise NotFound(f"no eval sample {sample_id!r}")
    previous = row.claim
    result = s.execute(
        update(EvalSample)
        .where(
            EvalSample.id == sample_id,
            EvalSample.slack_ts.is_(None),
            or_(
                EvalSample.claim.is_(None),
                EvalSample.claim == claim,
                and_(EvalSample.claimed_at.is_not(None), EvalSample.claimed_at < t - lease_s),
            ),
        )
        .values(claim=claim, claimed_at=t)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return None
    s.refresh(row)
    return "takeover" if previous not in (None, claim) else "new"


def mark_eval_sample_posted(s: Session, sample: EvalSample, channel: str, ts: str) -> None:
    if sample.slack_ts is None:
        sample.slack_channel, sample.slack_ts, sample.posted_at = channel, ts, now()


def record_rating(
    s: Session,
    sample: EvalSample,
    user_id: str,
    user_name: str = "",
    score: int | None = None,
    toggle_hallucination: bool = False,
) -> Rating:
    """Upsert one person's rating: a new score replaces theirs; the toggle flips their flag."""
    from sqlalchemy.exc import IntegrityError

    def current() -> Rating | None:
        return s.scalars(select(Rating).where(Rating.sample_id == sample.id, Rating.user_id == user_id)).first()

    rating = current()
    if rating is None:
        try:
            with s.begin_nested():
                rating = Rating(sample_id=sample.id, user_id=user_id, user_name=user_name, hallucination=False)
                s.add(rating)
        except IntegrityError:  # the same person's other click landed first
            rating = current()
    assert rating is not None
    if score is not None:
        rating.score = score
    if toggle_hallucination:
        rating.hallucination = not rating.hallucination
    if user_name:
        rating.user_name = user_name
    rating.updated_at = now()
    s.flush()
    return rating


def ratings_of(s: Session, sample_ids: list[str]) -> Sequence[Rating]:
    if not sample_ids:
        return []
    return s.scalars(select(Rating).where(Rating.sample_id.in_(sample_ids)).order_by(Rating.id)).all()


def tally(ratings: Sequence[Rating]) -> dict[str, Any]:
    """Mean of the scores given, and the share of raters who flagged a hallucination."""
    scores = [r.score for r in ratings if r.score is not None]
    flagged = sum(1 for r in ratings if r.hallucination)
    return {
        "raters": len({r.user_id for r in ratings}),
        "ratings": len(ratings),
        "scored": len(scores),
        "mean_score": sum(scores) / len(scores) if scores else None,
        "hallucinations": flagged,
        "hallucination_rate": flagged / len(ratings) if ratings else None,
    }


def ratings_by_checkpoint(s: Session, job: Job, raters_needed: int = 1) -> list[dict[str, Any]]:
    """Per rated checkpoint (by step): samples, tally over all its ratings, and whether every
    sample has `raters_needed` scores (`complete`)."""
    samples = eval_samples_of(s, job)
    ratings = ratings_of(s, [x.id for x in samples])
    by_sample: dict[str, list[Rating]] = {}
    for r in ratings:
        by_sample.setdefault(r.sample_id, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for x in samples:
        row = out.setdefault(
            x.checkpoint_uri,
            {
                "step": x.step,
                "uri": x.checkpoint_uri,
                "attempt_id": x.attempt_id,
                "samples": 0,
                "posted": 0,
                "_ratings": [],
                "complete": True,
            },
        )
        row["samples"] += 1
        row["posted"] += x.slack_ts is not None
        mine = by_sample.get(x.id, [])
        row["_ratings"].extend(mine)
        if sum(1 for r in mine if r.score is not None) < raters_needed:
            row["complete"] = False
    result = []
    for row in sorted(out.values(), key=lambda r: r["step"]):
        result.append({**{k: v for k, v in row.items() if k != "_ratings"}, **tally(row.pop("_ratings"))})
    return result


# --- metrics series (the dashboard's curves) --------------------------------------------------------

METRIC_SERIES = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "tokens_per_dollar")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if x == x and abs(x) != float("inf") else None


def record_metrics(s: Session, attempt: Attempt, records: list[dict[str, Any]]) -> int:
    """Store training-step records of an attempt; steps it has already are skipped (a re-sent
    batch is harmless). Non-finite values are stored as NULL. Returns how many were new."""
    steps: dict[int, dict[str, Any]] = {}
    for r in records:
        step = r.get("step") if isinstance(r, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**31 and r.get("event") is None:
            steps[step] = r
    if not steps:
        return 0
    have = set(
        s.scalars(
            select(MetricPoint.step).where(MetricPoint.attempt_id == attempt.id, MetricPoint.step.in_(list(steps)))
        )
    )
    rows = [
        dict(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            attempt_number=attempt.number,
            step=step,
            t=_finite(r.get("t")) or now(),
            **{k: _finite(r.get(k)) for k in METRIC_SERIES},
        )
        for step, r in sorted(steps.items())
        if step not in have
    ]
    if rows:
        s.execute(MetricPoint.__table__.insert(), rows)
    return len(rows)


def metric_rows(s: Session, job: Job) -> list[tuple]:
    """Every point of a job's chain: (attempt_number, step, t, *METRIC_SERIES), by step."""
    cols = [getattr(MetricPoint, k) for k in METRIC_SERIES]
    q = (
        select(MetricPoint.attempt_number, MetricPoint.step, MetricPoint.t, *cols)
        .where(MetricPoint.job_id == job.id)
        .order_by(MetricPoint.step, MetricPoint.attempt_number)
    )
    return [tuple(r) for r in s.execute(q)]


def metrics_version(s: Session, job: Job) -> tuple[int, int]:
    """(count, newest id) of a job's points: a cheap key for caching its downsampled curves."""
    count, newest = s.execute(
        select(func.count(MetricPoint.id), func.max(MetricPoint.id)).where(MetricPoint.job_id == job.id)
    ).one()
    return int(count or 0), int(newest or 0)


def _newest_per_job(s: Session, model, job_ids: list[str]) -> dict[str, Any]:
    """The row with the highest id of each job, in one query (for a whole jobs list)."""
    if not job_ids:
        return {}
    newest = select(func.max(model.id)).where(model.job_id.in_(job_ids)).group_by(model.job_id).scalar_subquery()
    return {row.job_id: row for row in s.scalars(select(model).where(model.id.in_(newest)))}


def latest_metrics(s: Session, job_ids: list[str]) -> dict[str, MetricPoint]:
    return _newest_per_job(s, MetricPoint, job_ids)


def latest_checkpoints(s: Session, job_ids: list[str]) -> dict[str, Checkpoint]:
    return _newest_per_job(s, Checkpoint, job_ids)


# --- web sessions ----------------------------------------------------------------------------------


def open_web_session(s: Session, token: Token, ttl_s: float) -> str:
    """A new session id for a dashboard login (returned once; only its hash is stored)."""
    sid = secrets.token_urlsafe(32)
    s.add(WebSession(id_hash=hash_token(sid), token_id=token.id, expires_at=now() + ttl_s))
    return sid


def find_web_session(s: Session, sid: str) -> Token | None:
    """The live token behind a session id, or None (unknown, expired, or its token revoked/expired)."""
    row = s.get(WebSession, hash_token(sid))
    if row is None or row.expires_at < now():
        return None
    token = s.get(Token, row.token_id)
    return token if _live(token) else None


def purge_web_sessions(s: Session) -> None:
    """Forget expired sessions (called at each login, so the table stays small)."""
    s.execute(delete(WebSession).where(WebSession.expires_at < now()))


def close_web_session(s: Session, sid: str) -> None:
    row = s.get(WebSession, hash_token(sid))
    if row is not None:
        s.delete(row)


# --- jobs created through the SageMaker-compatible endpoint ----------------------------------------


class NameInUse(ValueError):
    """A SageMaker training job of this name exists already in the tenant."""


def create_sagemaker_job(
    s: Session,
    spec: dict[str, Any],
    tenant: str,
    *,
    arn: str,
    region: str,
    request: dict[str, Any],
    tags: list[dict[str, str]],
    warnings: list[str],
) -> tuple[Job, SageMakerTrainingJob]:
    """The Aerie job and its SageMaker record, together or not at all; a taken name is NameInUse
    (the unique (tenant, arn) key decides, so two racing creates cannot both win)."""
    from sqlalchemy.exc import IntegrityError

    try:
        with s.begin_nested():
            job = create_job(s, spec, tenant)
            record = SageMakerTrainingJob(
                job_id=job.id,
                tenant=tenant,
                name=spec["name"],
                arn=arn,
                region=region,
                request=request,
                tags=tags,
                warnings=warnings,
            )
            s.add(record)
            s.flush()
    except IntegrityError:
        raise NameInUse(spec["name"]) from None
    return job, record


def get_sagemaker_job(s: Session, tenant: str, arn: str) -> SageMakerTrainingJob:
    """A tenant's SageMaker job by ARN (names resolve to ARNs in the caller's region)."""
    record = s.scalars(
        select(SageMakerTrainingJob).where(SageMakerTrainingJob.tenant == tenant, SageMakerTrainingJob.arn == arn)
    ).first()
    if record is None:
        raise NotFound(f"no training job {arn!r}")
    return record


def list_sagemaker_jobs(
    s: Session,
    tenant: str,
    region: str,
    *,
    name_contains: str | None = None,
    name_prefix: str | None = None,
    states: Sequence[str] | None = None,
    stop_requested: bool | None = None,
    created_after: float | None = None,
    created_before: float | None = None,
    modified_after: float | None = None,
    modified_before: float | None = None,
    sort_by: str = "CreationTime",
    descending: bool = False,
    limit: int = 10,
    offset: int = 0,
) -> Sequence[SageMakerTrainingJob]:
    """ListTrainingJobs' filters over the tenant's SageMaker jobs in one region (names match
    case-insensitively)."""
    q = select(SageMakerTrainingJob).join(Job, Job.id == SageMakerTrainingJob.job_id)
    q = q.where(SageMakerTrainingJob.tenant == tenant, SageMakerTrainingJob.region == region)
    if name_contains:
        q = q.where(func.lower(SageMakerTrainingJob.name).contains(name_contains.lower(), autoescape=True))
    if name_prefix:
        q = q.where(SageMakerTrainingJob.name.startswith(name_prefix, autoescape=True))
    if states is not None:
        q = q.where(Job.state.in_(list(states)))
    if stop_requested is not None:
        q = q.where(Job.stop_requested.is_(stop_requested))
    if created_after is not None:
        q = q.where(Job.created_at > created_after)
    if created_before is not None:
        q = q.where(Job.created_at < created_before)
    if modified_after is not None:
        q = q.where(Job.updated_at > modified_after)
    if modified_before is not None:
        q = q.where(Job.updated_at < modified_before)
    column = {"Name": SageMakerTrainingJob.name, "Status": Job.state}.get(sort_by, Job.created_at)
    order = [column.desc() if descending else column.asc(), SageMakerTrainingJob.job_id]
    q = q.options(selectinload(SageMakerTrainingJob.job).selectinload(Job.attempts))
    return s.scalars(q.order_by(*order).limit(limit).offset(offset)).all()


def sagemaker_instances_in_use(s: Session, tenant: str) -> int:
    """Instances held by the tenant's SageMaker jobs that have not ended (the instance quota)."""
    q = (
        select(Job.spec)
        .join(SageMakerTrainingJob, SageMakerTrainingJob.job_id == Job.id)
        .where(SageMakerTrainingJob.tenant == tenant, Job.state.not_in(JOB_TERMINAL))
    )
    return sum(int((spec.get("resources") or {}).get("instance_count", 1)) for spec in s.scalars(q))
