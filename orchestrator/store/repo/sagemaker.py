"""Jobs created through the SageMaker-compatible endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from aerie_contracts.states import JOB_TERMINAL
from orchestrator.store.models import (
    Job,
    SageMakerTrainingJob,
)
from orchestrator.store.repo.jobs import create_job, found

# --- jobs created through the SageMaker-compatible endpoint -----------------------------------------


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
    return found(record, f"training job {arn!r}")


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
