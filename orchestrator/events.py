"""Deliver outbox events to the handlers subscribed to them, at least once.

Events are rows written in the same transaction as the state change they describe; this
dispatcher reads them in order and calls each subscribed handler with the EventBridge-shaped
event and a Lambda-like context, exactly as AWS would. A failure is retried with exponential
backoff; after `max_deliveries` the event is dead-lettered (visible in the API and CLI). Because
delivery state lives in the store, a control plane killed mid-delivery delivers again after a
restart: handlers are idempotent, so a second delivery changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import select

from orchestrator import failpoints
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Event

log = logging.getLogger("aerie.events")

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass
class LambdaContext:
    """The attributes of AWS Lambda's context object that handlers may read, plus where the API is."""

    function_name: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = ""
    aerie_api: str = ""
    aerie_token: str = ""
    deadline_ms: float = field(default_factory=lambda: time.time() * 1000 + 60_000)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.deadline_ms - time.time() * 1000))


@dataclass(frozen=True)
class Subscription:
    name: str
    detail_types: frozenset[str]
    handler: Handler


class Dispatcher:
    def __init__(self, db: Database, subscriptions: list[Subscription], api_url: str = "", token: str = "",
                 max_deliveries: int = 5, backoff_s: float = 1.0, batch: int = 50,
                 on_dead_letter: Callable[[Event], None] | None = None):
        self.db = db
        self.subscriptions = subscriptions
        self.api_url = api_url
        self.token = token
        self.max_deliveries = max_deliveries
        self.backoff_s = backoff_s
        self.batch = batch
        self.on_dead_letter = on_dead_letter
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval_s: float = 0.3) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.deliver_once()
                except Exception:
                    log.exception("delivery pass failed")
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def deliver_once(self) -> int:
        """Deliver every due event once, oldest first. Returns how many were attempted."""
        with self.db.session() as s:
            due = s.scalars(
                select(Event).where(Event.status == "pending", Event.next_attempt_at <= time.time())
                .order_by(Event.seq).limit(self.batch)
            ).all()
            work = [(e.seq, repo.eventbridge(e)) for e in due]
        for seq, event in work:
            error = self._deliver(event)
            failpoints.hit(f"events.after_deliver:{event['detail-type']}:{event['detail'].get('state', '')}")
            with self.db.session() as s:
                row = s.get(Event, seq)
                if row is None or row.status != "pending":
                    continue
                row.deliveries += 1
                if error is None:
                    row.status = "delivered"
                    row.last_error = None
                elif row.deliveries >= self.max_deliveries:
                    row.status = "dead"
                    row.last_error = error
                    log.error("event %s dead-lettered after %d deliveries: %s", row.id, row.deliveries, error)
                    if self.on_dead_letter:
                        self.on_dead_letter(row)
                else:
                    row.last_error = error
                    row.next_attempt_at = time.time() + self.backoff_s * 2 ** (row.deliveries - 1)
        return len(work)

    def _deliver(self, event: dict[str, Any]) -> str | None:
        errors = []
        for sub in self.subscriptions:
            if event["detail-type"] not in sub.detail_types:
                continue
            context = LambdaContext(function_name=sub.name, aerie_api=self.api_url, aerie_token=self.token)
            try:
                sub.handler(event, context)
            except Exception as exc:  # the handler's failure is the event's, to retry
                log.warning("handler %s failed on %s: %s", sub.name, event["id"], exc)
                errors.append(f"{sub.name}: {type(exc).__name__}: {exc}"[:1000])
        return "; ".join(errors) or None


def default_subscriptions() -> list[Subscription]:
    """The handlers `aerie up` runs in-process (in AWS they are Lambda functions on EventBridge rules)."""
    from lambdas import chain_restart, checkpoint_gc

    subs = [
        Subscription("chain_restart", frozenset({repo.ATTEMPT_STATE_CHANGE}), chain_restart.handler),
        Subscription("checkpoint_gc", frozenset({repo.CHECKPOINT_COMMITTED}), checkpoint_gc.handler),
    ]
    try:
        from lambdas import eval_dispatch
    except ImportError:
        return subs
    subs.append(Subscription("eval_dispatch", frozenset({repo.CHECKPOINT_COMMITTED}), eval_dispatch.handler))
    return subs
