"""Publishing the outbox to EventBridge: batches within the limits, rows delivered only once
EventBridge took them, failures retried, oversized events dead-lettered.

EventBridge and SQS are moto's server on loopback (the session's S3 server serves them too): a
custom bus, rules with the deployed stack's own patterns (`aerie_contracts.events`), SQS targets.
Partial failures of one PutEvents call (EventBridge answers some entries with an ErrorCode, e.g.
under throttling) are not something moto produces; that test uses botocore's Stubber.
"""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
from botocore.stub import Stubber

from aerie_contracts import events as contract_events
from orchestrator.eventbus import MAX_BYTES, MAX_ENTRIES, EventBridgePublisher, batches, entry, entry_size
from orchestrator.events import Dispatcher
from orchestrator.server import fail_job_of_dead_event
from orchestrator.store import Database, repo


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'aerie.db'}")
    yield database
    database.dispose()


@pytest.fixture
def bus(s3_env):
    """A fresh bus with two rules, as the deployed stack has them (failed attempts; everything
    from Aerie), each with an SQS queue as target. Returns (bus name, {rule: queue url})."""
    events, sqs = boto3.client("events"), boto3.client("sqs")
    name = f"aerie-{uuid.uuid4().hex[:8]}"
    events.create_event_bus(Name=name)
    queues = {}
    for rule, pattern in {
        "failed": contract_events.ATTEMPT_FAILED_PATTERN,
        "all": {"source": [contract_events.SOURCE]},
    }.items():
        url = sqs.create_queue(QueueName=f"{name}-{rule}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name=f"{name}-{rule}", EventBusName=name, EventPattern=json.dumps(pattern))
        events.put_targets(Rule=f"{name}-{rule}", EventBusName=name, Targets=[{"Id": "q", "Arn": arn}])
        queues[rule] = url
    return name, queues


def drain(url: str, want: int | None = None, wait_s: int = 1) -> list[dict]:
    sqs = boto3.client("sqs")
    got: list[dict] = []
    while True:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s).get("Messages", [])
        got += [json.loads(m["Body"]) for m in batch]
        for m in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if not batch or (want is not None and len(got) >= want):
            return got


def _failed_attempt(db) -> str:
    with db.session() as s:
        job = repo.create_job(s, {"name": "j", "backend": "local", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Running")
        repo.set_attempt_state(s, attempt, "Failed", {"kind": "silent.hang", "host": "algo-2", "message": "x"})
        return job.id


def _statuses(db, job_id: str) -> dict[str, str]:
    with db.session() as s:
        return {
            f"{e.detail_type}:{e.detail.get('state', '')}": e.status
            for e in repo.list_events(s, repo.get_job(s, "default", job_id))
        }


def _event(seq: int, detail_bytes: int = 10) -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Aerie Verdict Raised",
        "source": contract_events.SOURCE,
        "time": "2026-11-23T01:02:03Z",
        "resources": ["aerie:job/j"],
        "detail": {"job_id": "j", "message": "x" * detail_bytes, "seq": seq},
    }


def test_batches_hold_at_most_ten_entries_and_256_kb():
    sizes = [10, 100_000, 100_000, 70_000, 10, 300_000, *([10] * 15)]
    entries = [entry(_event(i, n), "aerie") for i, n in enumerate(sizes)]
    groups = list(batches(entries))
    assert [i for g in groups for i in g] == [i for i in range(len(sizes)) if i != 5]  # order kept, oversize left out
    for g in groups:
        assert len(g) <= MAX_ENTRIES and sum(entry_size(entries[i]) for i in g) <= MAX_BYTES
    assert groups[0] == [0, 1, 2]  # a fourth 70 KB entry would pass 256 KB
    # EventBridge's own size rule: 14 bytes of Time + Source, DetailType, Detail, Resources in UTF-8.
    e = entry(_event(1, 0), "aerie")
    assert entry_size(e) == 14 + len("aerie.orchestrator") + len("Aerie Verdict Raised") + len(e["Detail"]) + len(
        "aerie:job/j"
    )


def test_many_large_events_arrive_once_each_in_calls_within_the_limits(bus):
    name, queues = bus
    publisher = EventBridgePublisher(name)
    calls = []
    publisher.client.meta.events.register(
        "provide-client-params.events.PutEvents", lambda params, **_: calls.append(params["Entries"])
    )
    events = [_event(seq, 40_000 if seq % 3 == 0 else 50) for seq in range(1, 24)]
    outcomes = publisher.publish(events)
    assert all(o.error is None for o in outcomes)
    assert len(calls) >= 3 and all(len(c) <= MAX_ENTRIES and sum(map(entry_size, c)) <= MAX_BYTES for c in calls)
    got = drain(queues["all"], want=23)
    assert sorted(e["detail"]["seq"] for e in got) == list(range(1, 24))


def test_the_dispatcher_publishes_and_marks_rows_delivered(db, bus):
    name, queues = bus
    job_id = _failed_attempt(db)
    d = Dispatcher(db, [], publisher=EventBridgePublisher(name))
    assert d.deliver_once() == 4
    assert set(_statuses(db, job_id).values()) == {"delivered"}
    assert d.deliver_once() == 0
    [failed] = drain(queues["failed"])
    with db.session() as s:
        row = next(
            e for e in repo.list_events(s, repo.get_job(s, "default", job_id)) if e.detail.get("state") == "Failed"
        )
    # The shape the deployed chain_restart reads, with the outbox seq as the idempotency key.
    assert failed["source"] == "aerie.orchestrator" and failed["detail-type"] == "Aerie Attempt State Change"
    assert failed["detail"] == {**row.detail, "seq": row.seq}
    assert failed["resources"] == [f"aerie:job/{job_id}"]
    assert len(drain(queues["all"])) == 4


def test_an_unreachable_bus_keeps_events_pending_until_it_answers(db, bus, s3_env):
    name, queues = bus
    job_id = _failed_attempt(db)
    missing = f"{name}-not-yet"
    d = Dispatcher(db, [], publisher=EventBridgePublisher(missing), backoff_s=0.0)
    d.deliver_once()
    with db.session() as s:
        rows = repo.list_events(s, repo.get_job(s, "default", job_id))
        assert {r.status for r in rows} == {"pending"} and all(r.deliveries == 1 for r in rows)
        assert all("ResourceNotFoundException" in r.last_error for r in rows)
    d.publisher.bus = name  # the bus exists now (say, the stack finished deploying)
    d.deliver_once()
    assert set(_statuses(db, job_id).values()) == {"delivered"}
    assert len(drain(queues["failed"])) == 1


def test_entries_eventbridge_refused_are_retried_alone(db, s3_env):
    """PutEvents answers per entry; only the refused ones are sent again (Stubber: moto never refuses)."""
    job_id = _failed_attempt(db)
    client = boto3.client("events")
    stub = Stubber(client)
    ok = {"EventId": "e-1"}
    throttled = {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"}
    stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [ok, ok, ok, throttled]})
    stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [ok]})
    d = Dispatcher(db, [], publisher=EventBridgePublisher("aerie", client=client), backoff_s=0.0)
    with stub:
        d.deliver_once()
        statuses = _statuses(db, job_id)
        assert statuses.pop("Aerie Attempt State Change:Failed") == "pending"
        assert set(statuses.values()) == {"delivered"}
        d.deliver_once()
        stub.assert_no_pending_responses()
    assert set(_statuses(db, job_id).values()) == {"delivered"}


def test_an_event_too_large_for_eventbridge_is_dead_lettered_and_fails_its_job(db, bus):
    name, _ = bus
    with db.session() as s:
        job = repo.create_job(s, {"name": "big", "backend": "local", "entrypoint": ["x"]}, "default")
        repo.set_job_state(s, job, "InProgress")
        attempt = repo.create_attempt(s, job, 1)
        repo.set_attempt_state(s, attempt, "Failed", {"kind": "exit.nonzero", "message": "m" * (MAX_BYTES + 1)})
        job_id = job.id
    d = Dispatcher(db, [], publisher=EventBridgePublisher(name), on_dead_letter=fail_job_of_dead_event(db))
    d.deliver_once()
    with db.session() as s:
        job = repo.get_job(s, "default", job_id)
        dead = [e for e in repo.list_events(s, job) if e.status == "dead"]
        assert len(dead) == 1 and dead[0].deliveries == 1 and "limit" in dead[0].last_error
        assert job.state == "Failed" and job.reason["kind"] == "chain.dead_letter"
