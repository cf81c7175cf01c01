"""Human eval: the samples posted to Slack, claims on them, and the raters' scores."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, or_, select, update
from sqlalchemy.orm import Session

from orchestrator.store.models import (
    EvalSample,
    Job,
    Rating,
    now,
)
from orchestrator.store.repo.jobs import found

# --- human eval: samples and ratings ----------------------------------------------------------------


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
    return found(s.get(EvalSample, sample_id), f"eval sample {sample_id!r}")


def claim_eval_sample(s: Session, sample_id: str, claim: str, lease_s: float) -> str | None:
    """Take the right to post a sample: one atomic conditional UPDATE, so two deliveries never
    both post. Returns None (posted already, or someone else holds a fresh claim), "new", or
    "takeover" (a previous poster's claim expired: it may have posted before dying)."""
    from sqlalchemy import and_

    t = now()
    row = found(s.get(EvalSample, sample_id), f"eval sample {sample_id!r}")
    previous = row.claim
    # An UPDATE's result is a CursorResult (its rowcount); Session.execute is typed for any statement.
    result = cast(
        CursorResult[Any],
        s.execute(
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
            .execution_options(synchronize_session=False),
        ),
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
