"""Training-metric series for the dashboard's curves."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from orchestrator.store.models import (
    Attempt,
    Checkpoint,
    Job,
    MetricPoint,
    now,
)

# The two kinds of rows the jobs list shows the newest of.
_Row = TypeVar("_Row", MetricPoint, Checkpoint)

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
        # A Core insert of the whole batch; `__table__` is typed FromClause, and a class with a
        # `__tablename__` is mapped to a Table.
        s.execute(cast(Table, MetricPoint.__table__).insert(), rows)
    return len(rows)


def metric_rows(s: Session, job: Job) -> list[tuple[Any, ...]]:
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


def _newest_per_job(s: Session, model: type[_Row], job_ids: list[str]) -> dict[str, _Row]:
    """The row with the highest id of each job, in one query (for a whole jobs list)."""
    if not job_ids:
        return {}
    newest = select(func.max(model.id)).where(model.job_id.in_(job_ids)).group_by(model.job_id).scalar_subquery()
    return {row.job_id: row for row in s.scalars(select(model).where(model.id.in_(newest)))}


def latest_metrics(s: Session, job_ids: list[str]) -> dict[str, MetricPoint]:
    return _newest_per_job(s, MetricPoint, job_ids)


def latest_checkpoints(s: Session, job_ids: list[str]) -> dict[str, Checkpoint]:
    return _newest_per_job(s, Checkpoint, job_ids)
