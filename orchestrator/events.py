"""Deliver outbox events to the handlers subscribed to them, or to EventBridge, at least once.

Events are rows written in the same transaction as the state change they describe; this
dispatcher reads them in order and either calls each subscribed handler with the
EventBridge-shaped event and a Lambda-like context, exactly as AWS would (the default), or, when
the control plane is given an EventBridge bus (`AERIE_EVENT_BUS`), publishes them there
(`orchestrator/eventbus.py`), where the bus's rules invoke the deployed Lambda functions.
A row is marked delivered only when every handler it goes to succeeded (or EventBridge took it).
A failure is retried with exponential backoff; after `max_deliveries` the event is dead-lettered
(visible in the API and CLI). Because delivery state lives in the store, a control plane killed
mid-delivery delivers again after a restart: handlers are idempotent, so a second delivery
changes nothing, and every delivery carries the outbox sequence number (`detail.seq`) to dedupe on.

Slow handlers (`Subscription.slow`: eval_dispatch samples a checkpoint for minutes) run on worker
threads fed by a bounded queue, not in the pass itself: the pass runs inside the controller's
reconcile loop, which must keep its period (launches, lost nodes, chain_restart) while an eval
runs. An event with a slow handler stays pending until that handler finished too; its fast
handlers run at once and are not run again when only the slow one is retried. When the queue is
full the slow part waits, in the store, for a later pass (nothing is lost, and it does not count
as a failed delivery). What a handler already did is remembered in memory only: after a restart
every handler of a pending event runs again, which at-least-once delivery allows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from aerie_contracts import DetailType
from aerie_contracts.states import OutboxStatus
from orchestrator import failpoints
from orchestrator.eventbus import EventBridgePublisher
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Event

log = logging.getLogger("aerie.events")

Handler = Callable[[dict[str, Any], Any], Any]

PUBLISHED = "eventbridge"  # remembered like a handler's name once EventBridge took the event
MAX_BACKOFF_S = 60.0  # the longest wait between two deliveries of a failing event
DEFER_S = 2.0  # how long an event whose slow handler found the queue full waits to try again


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
    # Runs on the slow-handler workers, never in the dispatcher's pass (see the module docstring).
    slow: bool = False
    # The handler's time limit as its context reports it (a Lambda function's timeout).
    timeout_s: float = 60.0


class SlowLane:
    """Worker threads for slow handlers, fed by a bounded queue; results come back on `done`.

    Daemon threads, so a control plane that is stopped mid-eval exits at once: the event is
    still pending in the store and is delivered again by the next leader."""

    def __init__(self, workers: int = 1, queue_size: int = 8):
        self.workers = max(1, workers)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (seq, subscription name, error or None)
        self._threads: list[threading.Thread] = []

    def submit(self, seq: int, sub: Subscription, event: dict[str, Any], context: LambdaContext) -> bool:
        """Queue one handler call; False when the queue is full (try again later)."""
        if not self._threads:
            for i in range(self.workers):
                t = threading.Thread(target=self._work, name=f"events-slow-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        try:
            self._queue.put_nowait((seq, sub, event, context))
        except queue.Full:
            return False
        return True

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            seq, sub, event, context = item
            self.done.put((seq, sub.name, call(sub, event, context)))

    def close(self) -> None:
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break  # busy workers are daemons: they end with the process


def call(sub: Subscription, event: dict[str, Any], context: LambdaContext) -> str | None:
    """Run one handler; its error as text, or None."""
    try:
        sub.handler(event, context)
    except Exception as exc:  # the handler's failure is the event's, to retry
        log.warning("handler %s failed on %s: %s", sub.name, event["id"], exc)
        return f"{sub.name}: {type(exc).__name__}: {exc}"[:1000]
    return None


class Dispatcher:
    def __init__(
        self,
        db: Database,
        subscriptions: list[Subscription],
        api_url: str = "",
        token: str = "",
        max_deliveries: int = 5,
        backoff_s: float = 1.0,
        batch: int = 50,
        on_dead_letter: Callable[[Event], None] | None = None,
        publisher: EventBridgePublisher | None = None,
        slow_workers: int = 1,
        slow_queue: int = 8,
    ):
        self.db = db
        self.subscriptions = subscriptions
        self.api_url = api_url
        self.token = token
        self.max_deliveries = max_deliveries
        self.backoff_s = backoff_s
        self.batch = batch
        self.on_dead_letter = on_dead_letter
        self.publisher = publisher
        self.slow = SlowLane(slow_workers, slow_queue)
        # Per outbox seq, in this process only: what already succeeded (handler names, PUBLISHED),
        # the errors of the round in progress, and how many slow handlers are still out.
        self._done: dict[int, set[str]] = {}
        self._round_errors: dict[int, list[str]] = {}
        self._in_flight: dict[int, int] = {}
        self._events: dict[int, dict[str, Any]] = {}  # events whose slow handlers are out
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
        self.slow.close()

    @property
    def in_flight(self) -> int:
        """Slow handler calls queued or running."""
        return sum(self._in_flight.values())

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no slow handler is out, recording their outcomes (tests, shutdown)."""
        deadline = time.time() + timeout_s
        while True:
            self._collect()
            if not self._in_flight:
                return True
            if time.time() > deadline:
                return False
            time.sleep(0.05)

    def deliver_once(self) -> int:
        """Deliver every due event once, oldest first. Returns how many were attempted."""
        self._collect()
        with self.db.session() as s:
            q = select(Event).where(Event.status == OutboxStatus.PENDING, Event.next_attempt_at <= time.time())
            if self._in_flight:
                q = q.where(Event.seq.not_in(list(self._in_flight)))
            due = s.scalars(q.order_by(Event.seq).limit(self.batch)).all()
            work = [(e.seq, repo.eventbridge(e)) for e in due]
        published = self._publish(work)
        for seq, event in work:
            errors, permanent = published.get(seq, ([], False))
            errors = errors + self._run_fast(seq, event)
            if not permanent:  # a dead event goes to nobody else
                self._queue_slow(seq, event)
            failpoints.hit(f"events.after_deliver:{event['detail-type']}:{event['detail'].get('state', '')}")
            if self._in_flight.get(seq):
                self._round_errors[seq] = errors  # the round ends when its slow handlers do
                self._events[seq] = event
            else:
                self._end_round(seq, event, errors, permanent)
        return len(work)

    # --- one round of one event -------------------------------------------------------------

    def _subscribers(self, event: dict[str, Any]) -> list[Subscription]:
        return [sub for sub in self.subscriptions if event["detail-type"] in sub.detail_types]

    def _context(self, sub: Subscription) -> LambdaContext:
        return LambdaContext(
            function_name=sub.name,
            aerie_api=self.api_url,
            aerie_token=self.token,
            deadline_ms=time.time() * 1000 + sub.timeout_s * 1000,
        )

    def _publish(self, work: list[tuple[int, dict[str, Any]]]) -> dict[int, tuple[list[str], bool]]:
        """Publish what EventBridge has not taken yet; per seq: (errors, permanent)."""
        if self.publisher is None:
            return {}
        todo = [(seq, event) for seq, event in work if PUBLISHED not in self._done.get(seq, ())]
        if not todo:
            return {}
        outcomes = self.publisher.publish([event for _, event in todo])
        result: dict[int, tuple[list[str], bool]] = {}
        for (seq, event), outcome in zip(todo, outcomes, strict=True):
            if outcome.error is None:
                self._done.setdefault(seq, set()).add(PUBLISHED)
                failpoints.hit(f"events.after_publish:{event['detail-type']}:{event['detail'].get('state', '')}")
            else:
                result[seq] = ([outcome.error], outcome.permanent)
        return result

    def _run_fast(self, seq: int, event: dict[str, Any]) -> list[str]:
        errors = []
        for sub in self._subscribers(event):
            if sub.slow or sub.name in self._done.get(seq, ()):
                continue
            error = call(sub, event, self._context(sub))
            if error is None:
                self._done.setdefault(seq, set()).add(sub.name)
            else:
                errors.append(error)
        return errors

    def _queue_slow(self, seq: int, event: dict[str, Any]) -> None:
        """Hand the event's slow handlers to the workers (those that find the queue full wait)."""
        for sub in self._subscribers(event):
            if not sub.slow or sub.name in self._done.get(seq, ()):
                continue
            if self.slow.submit(seq, sub, event, self._context(sub)):
                self._in_flight[seq] = self._in_flight.get(seq, 0) + 1

    def _collect(self) -> None:
        """Record what the slow handlers finished since the last pass."""
        while True:
            try:
                seq, name, error = self.slow.done.get_nowait()
            except queue.Empty:
                return
            if error is None:
                self._done.setdefault(seq, set()).add(name)
            else:
                self._round_errors.setdefault(seq, []).append(error)
            self._in_flight[seq] -= 1
            if not self._in_flight[seq]:
                del self._in_flight[seq]
                self._end_round(seq, self._events.pop(seq), self._round_errors.pop(seq, []))

    def _end_round(self, seq: int, event: dict[str, Any], errors: list[str], permanent: bool = False) -> None:
        """After every handler of the round ran: record the outcome, unless the round only
        waited (a slow handler found no room on the queue and nothing failed): it goes on later."""
        needed = {sub.name for sub in self._subscribers(event)} | ({PUBLISHED} if self.publisher else set())
        if not errors and not permanent and not needed <= self._done.get(seq, set()):
            # Out of the next passes' way for a moment, so that waiting evals never crowd the
            # events behind them (an attempt's failure) out of a pass's batch.
            with self.db.session() as s:
                row = s.get(Event, seq)
                if row is not None and row.status == OutboxStatus.PENDING:
                    row.next_attempt_at = time.time() + DEFER_S
            return
        self._finish(seq, errors, permanent)

    def _finish(self, seq: int, errors: list[str], permanent: bool = False) -> None:
        """End one delivery round of an event: delivered, retried later, or dead."""
        dead = None
        with self.db.session() as s:
            row = s.get(Event, seq)
            if row is None or row.status != OutboxStatus.PENDING:  # another leader finished it
                self._forget(seq)
                return
            row.deliveries += 1
            error = "; ".join(errors) or None
            if error is None:
                row.status = OutboxStatus.DELIVERED
                row.last_error = None
                self._forget(seq)
            elif permanent or row.deliveries >= self.max_deliveries:
                row.status = OutboxStatus.DEAD
                row.last_error = error
                log.error("event %s dead-lettered after %d deliveries: %s", row.id, row.deliveries, error)
                dead = row
                self._forget(seq)
            else:
                row.last_error = error
                row.next_attempt_at = time.time() + min(MAX_BACKOFF_S, self.backoff_s * 2 ** (row.deliveries - 1))
        if dead is not None and self.on_dead_letter:
            self.on_dead_letter(dead)  # after the commit: it may write in a transaction of its own

    def _forget(self, seq: int) -> None:
        self._done.pop(seq, None)
        self._round_errors.pop(seq, None)
        self._events.pop(seq, None)


def default_subscriptions() -> list[Subscription]:
    """The handlers `aerie up` runs in-process (in AWS they are Lambda functions on EventBridge rules)."""
    from lambdas import chain_restart, checkpoint_gc

    subs = [
        Subscription("chain_restart", frozenset({DetailType.ATTEMPT_STATE_CHANGE}), chain_restart.handler),
        Subscription("checkpoint_gc", frozenset({DetailType.CHECKPOINT_COMMITTED}), checkpoint_gc.handler),
    ]
    try:
        from lambdas import eval_dispatch
    except ImportError:
        return subs
    # Slow: sampling a checkpoint takes minutes, on the workers, off the controller's loop.
    subs.append(
        Subscription(
            "eval_dispatch",
            frozenset({DetailType.CHECKPOINT_COMMITTED}),
            eval_dispatch.handler,
            slow=True,
            timeout_s=eval_dispatch.SAMPLER_TIMEOUT_S + eval_dispatch.LEASE_S + 60,
        )
    )
    return subs
