"""Human eval: a checkpoint's samples (what eval_dispatch posts) and people's ratings of them.

Bearer auth like every job route (writes need a writer: member, admin or service token),
tenant-scoped through the sample's job. The sample routes are
what the eval_dispatch handler calls (claim, then mark posted: one Slack message per sample even
when events are redelivered); `GET /v1/jobs/{job}/ratings` is what people and the CLI read.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from orchestrator.api.deps import Principal, SessionDep, UserDep, WriterDep, job_of
from orchestrator.store import repo
from orchestrator.store.models import EvalSample, Job, columns

router = APIRouter(tags=["eval"])


class AnswerIn(BaseModel):
    prompt_index: int = Field(ge=0)
    prompt: str = Field(max_length=100_000)
    answer: str = Field(max_length=100_000)
    meta: dict[str, Any] = Field(default_factory=dict)


class SamplesIn(BaseModel):
    checkpoint_uri: str
    step: int = Field(ge=0)
    attempt_id: str | None = None
    channel: str | None = None
    answers: list[AnswerIn] = Field(max_length=200)


class ClaimIn(BaseModel):
    claim: str = Field(min_length=1, max_length=64)
    lease_s: float = Field(default=600.0, gt=0)


class PostedIn(BaseModel):
    channel: str
    ts: str


class RatingIn(BaseModel):
    user_id: str = Field(min_length=1, max_length=64)
    user_name: str = Field(default="", max_length=128)
    score: int | None = Field(default=None, ge=1, le=5)
    toggle_hallucination: bool = False


def sample_out(x: EvalSample) -> dict[str, Any]:
    copied = columns(x, "id", "job_id", "attempt_id", "checkpoint_uri", "step", "prompt_index", "prompt", "answer")
    posting = columns(x, "slack_channel", "slack_ts", "created_at", "posted_at")
    return dict(**copied, meta=x.meta or {}, **posting)


def raters_needed(job: Job) -> int:
    return int(((job.spec or {}).get("eval") or {}).get("raters_needed") or 3)


def _sample(s: Session, who: Principal, sample_id: str) -> EvalSample:
    try:
        sample = repo.get_eval_sample(s, sample_id)
    except repo.NotFound:
        sample = None
    job = s.get(Job, sample.job_id) if sample else None
    if sample is None or job is None or job.tenant != who.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no eval sample {sample_id!r}")
    return sample


@router.get("/v1/jobs/{job_ref}/eval/samples")
def list_samples(s: SessionDep, job_ref: str, who: UserDep, checkpoint_uri: str | None = None) -> list[dict[str, Any]]:
    return [sample_out(x) for x in repo.eval_samples_of(s, job_of(s, who, job_ref), checkpoint_uri)]


@router.post("/v1/jobs/{job_ref}/eval/samples")
def add_samples(s: SessionDep, job_ref: str, body: SamplesIn, who: WriterDep) -> list[dict[str, Any]]:
    """Store a checkpoint's answers (existing ones are kept) and return every sample of it."""
    job = job_of(s, who, job_ref)
    rows = repo.add_eval_samples(
        s, job, body.checkpoint_uri, body.step, body.attempt_id, [a.model_dump() for a in body.answers], body.channel
    )
    return [sample_out(x) for x in rows]


@router.post("/v1/eval/samples/{sample_id}/claim")
def claim(s: SessionDep, sample_id: str, body: ClaimIn, who: WriterDep) -> dict[str, Any]:
    """`claimed`: "new", "takeover" (an earlier poster's claim expired) or null (posted, or busy)."""
    _sample(s, who, sample_id)
    got = repo.claim_eval_sample(s, sample_id, body.claim, body.lease_s)
    return {"claimed": got, "sample": sample_out(repo.get_eval_sample(s, sample_id))}


@router.post("/v1/eval/samples/{sample_id}/posted")
def posted(s: SessionDep, sample_id: str, body: PostedIn, who: WriterDep) -> dict[str, Any]:
    sample = _sample(s, who, sample_id)
    repo.mark_eval_sample_posted(s, sample, body.channel, body.ts)
    return sample_out(sample)


@router.post("/v1/eval/samples/{sample_id}/ratings")
def rate(s: SessionDep, sample_id: str, body: RatingIn, who: WriterDep) -> dict[str, Any]:
    """Record one person's click (the Lambda form of the Slack endpoint calls this)."""
    sample = _sample(s, who, sample_id)
    return record_and_tally(s, sample, body.user_id, body.user_name, body.score, body.toggle_hallucination)


def record_and_tally(
    s: Session, sample: EvalSample, user_id: str, user_name: str, score: int | None, toggle: bool
) -> dict[str, Any]:
    repo.record_rating(s, sample, user_id, user_name, score, toggle)
    job = s.get(Job, sample.job_id)
    tally = repo.tally(repo.ratings_of(s, [sample.id]))
    return {
        "sample": sample_out(sample),
        "tally": tally,
        "raters_needed": raters_needed(job),
        "job": {"id": job.id, "name": job.name},
    }


@router.get("/v1/jobs/{job_ref}/ratings")
def ratings(s: SessionDep, job_ref: str, who: UserDep) -> list[dict[str, Any]]:
    """Per rated checkpoint: step, samples, raters, mean score (1-5) and hallucination rate."""
    job = job_of(s, who, job_ref)
    return repo.ratings_by_checkpoint(s, job, raters_needed(job))
