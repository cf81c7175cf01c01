"""The transactional outbox: events written with the state change they describe."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aerie_contracts.events import SEQ, SOURCE
from aerie_contracts.states import OutboxStatus
from orchestrator.store.models import (
    Event,
    Job,
    now,
)

# --- events -----------------------------------------------------------------------------------------


def emit(s: Session, job: Job, detail_type: str, detail: dict[str, Any]) -> Event:
    event = Event(
        id=str(uuid.uuid4()),
        job_id=job.id,
        tenant=job.tenant,
        detail_type=detail_type,
        source=SOURCE,
        time=now(),
        detail={"job_id": job.id, "job_name": job.name, **detail},
        status=OutboxStatus.PENDING,
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
