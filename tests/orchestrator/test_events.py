"""The outbox dispatcher: at-least-once delivery, backoff, dead letters, survival across restarts,
slow handlers on their own workers."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from aerie_contracts import DetailType
from orchestrator.events import Dispatcher, Subscription
from orchestrator.store import Database, repo
from orchestrator.store.models import Event
from tests.helpers.wait import wait_for


def _job(db) -> str:
    with db.session() as s:
        return repo.create_job(s, {"name": "j", "backend": "local"}, "default").id


def test_each_event_reaches_its_subscribers_once_on_success(db):
    _job(db)
    seen = []
    d = Dispatcher(db, [Subscription("h", frozenset({DetailType.JOB_STATE_CHANGE}), lambda e, c: seen.append((e, c)))])
    assert d.deliver_once() == 1
    assert d.deliver_once() == 0
    event, ctx = seen[0]
    assert event["detail-type"] == "Aerie Job State Change" and event["version"] == "0"
    assert ctx.function_name == "h" and ctx.get_remaining_time_in_millis() > 0


def test_failures_are_retried_with_backoff_then_dead_lettered(db):
    _job(db)
    calls = []
    dead = []

    def flaky(event, ctx):
        calls.append(event["id"])
        raise RuntimeError("downstream unavailable")

    d = Dispatcher(
        db,
        [Subscription("flaky", frozenset({DetailType.JOB_STATE_CHANGE}), flaky)],
        max_deliveries=3,
        backoff_s=0.0,
        on_dead_letter=dead.append,
    )
    for _ in range(5):
        d.deliver_once()
    assert len(calls) == 3
    assert len(dead) == 1 and dead[0].status == "dead" and "downstream unavailable" in dead[0].last_error


def test_backoff_delays_the_next_delivery(db):
    _job(db)
    calls = []

    def fail(event, ctx):
        calls.append(1)
        raise RuntimeError("no")

    d = Dispatcher(db, [Subscription("f", frozenset({DetailType.JOB_STATE_CHANGE}), fail)], backoff_s=60.0)
    d.deliver_once()
    d.deliver_once()
    assert len(calls) == 1  # the retry is scheduled a minute later, not now


def test_undelivered_events_survive_a_restart(db, db_url):
    _job(db)
    seen = []
    # A "crashed" dispatcher delivered nothing; a new one over the same store delivers everything.
    Dispatcher(
        Database(db_url), [Subscription("h", frozenset({DetailType.JOB_STATE_CHANGE}), lambda e, c: seen.append(e))]
    ).deliver_once()
    assert len(seen) == 1


# --- slow handlers (eval) on their own workers ---------------------------------------------------


def _checkpoint(db, job_id: str, step: int) -> None:
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        attempt = job.attempts[0] if job.attempts else repo.create_attempt(s, job, 1)
        repo.record_checkpoint(s, attempt, step, f"s3://b/{job_id}/step_{step:08d}", {})


def _rows(db, job_id: str, detail_type: str) -> list:
    with db.session() as s:
        return [e for e in repo.list_events(s, repo.get_job(s, "default", job_id)) if e.detail_type == detail_type]


class Gate:
    """A slow handler that runs until the test opens the gate (or fails, if told to)."""

    def __init__(self):
        self.open = threading.Event()
        self.calls: list[int] = []
        self.fail = False

    def __call__(self, event, ctx):
        self.calls.append(event["detail"]["seq"])
        assert self.open.wait(30), "the gate never opened"
        if self.fail:
            raise RuntimeError("sampler crashed")


def test_a_slow_handler_never_holds_the_pass_nor_other_events(db):
    """While eval runs, the pass returns at once, chain_restart's events are delivered, and the
    checkpoint's fast handler ran; the checkpoint's row is delivered only when eval finished."""
    job_id = _job(db)
    _checkpoint(db, job_id, 10)
    fast, chained = [], []
    gate = Gate()
    d = Dispatcher(
        db,
        [
            Subscription("eval", frozenset({DetailType.CHECKPOINT_COMMITTED}), gate, slow=True),
            Subscription(
                "gc", frozenset({DetailType.CHECKPOINT_COMMITTED}), lambda e, c: fast.append(e["detail"]["seq"])
            ),
            Subscription(
                "chain", frozenset({DetailType.JOB_STATE_CHANGE}), lambda e, c: chained.append(e["detail"]["seq"])
            ),
        ],
    )
    t0 = time.monotonic()
    d.deliver_once()
    with db.session() as s:
        repo.set_job_state(s, repo.get_job(s, "default", job_id), "InProgress")
    d.deliver_once()
    assert time.monotonic() - t0 < 5 and d.in_flight == 1
    assert len(chained) == 2 and len(fast) == 1  # both job events delivered; gc ran once
    [ckpt] = _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    assert ckpt.status == "pending" and ckpt.deliveries == 0
    for _ in range(3):
        d.deliver_once()  # the in-flight event is not picked up again
    assert gate.calls == [ckpt.seq] and len(fast) == 1
    gate.open.set()
    assert d.wait_idle(10)
    [ckpt] = _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    assert ckpt.status == "delivered" and ckpt.deliveries == 1


def test_a_failed_slow_handler_is_retried_alone(db):
    job_id = _job(db)
    _checkpoint(db, job_id, 10)
    fast = []
    gate = Gate()
    gate.fail = True
    gate.open.set()
    d = Dispatcher(
        db,
        [
            Subscription("eval", frozenset({DetailType.CHECKPOINT_COMMITTED}), gate, slow=True),
            Subscription("gc", frozenset({DetailType.CHECKPOINT_COMMITTED}), lambda e, c: fast.append(1)),
        ],
        backoff_s=0.0,
    )
    d.deliver_once()
    assert d.wait_idle(10)
    [ckpt] = _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    assert ckpt.status == "pending" and ckpt.deliveries == 1 and "sampler crashed" in ckpt.last_error
    gate.fail = False
    d.deliver_once()
    assert d.wait_idle(10)
    [ckpt] = _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    assert ckpt.status == "delivered" and ckpt.deliveries == 2
    assert len(gate.calls) == 2 and fast == [1]  # gc succeeded the first time: not run again


def test_a_full_slow_queue_makes_events_wait_without_losing_or_failing_them(db):
    job_id = _job(db)
    for step in (10, 20, 30, 40):
        _checkpoint(db, job_id, step)
    gate = Gate()
    d = Dispatcher(
        db,
        [Subscription("eval", frozenset({DetailType.CHECKPOINT_COMMITTED}), gate, slow=True)],
        slow_workers=1,
        slow_queue=1,
    )

    def due_now() -> None:  # the deferred ones are due again after DEFER_S; don't wait for it here
        with db.session() as s:
            for r in repo.list_events(s, repo.get_job(s, "default", job_id)):
                r.next_attempt_at = 0.0

    d.deliver_once()
    # Whether the second event found the queue's one slot free depends on how fast the worker took
    # the first: wait until it holds one, then offer the rest again.
    wait_for(lambda: gate.calls, timeout_s=10, what="the slow worker to take an event")
    due_now()
    d.deliver_once()
    assert d.in_flight == 2  # one running, one queued; the other two wait in the store
    waiting = [r for r in _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED) if r.seq not in gate.calls]
    assert all(r.status == "pending" and r.deliveries == 0 for r in waiting)
    gate.open.set()
    deadline = time.time() + 20
    while time.time() < deadline and any(
        r.status != "delivered" for r in _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    ):
        time.sleep(0.1)
        due_now()
        d.deliver_once()
    rows = _rows(db, job_id, DetailType.CHECKPOINT_COMMITTED)
    assert [r.status for r in rows] == ["delivered"] * 4 and [r.deliveries for r in rows] == [1] * 4
    assert sorted(gate.calls) == [r.seq for r in rows]  # each sampled once


def test_every_delivery_carries_the_outbox_seq(db):
    _job(db)
    seen = []
    Dispatcher(
        db, [Subscription("h", frozenset({DetailType.JOB_STATE_CHANGE}), lambda e, c: seen.append(e))]
    ).deliver_once()
    with db.session() as s:
        [row] = s.scalars(select(Event)).all()
    assert seen[0]["detail"]["seq"] == row.seq and seen[0]["id"] == row.id
