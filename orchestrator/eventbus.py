"""Publish outbox events to an EventBridge bus (`AERIE_EVENT_BUS`), for the deployed handlers.

The outbox dispatcher (`orchestrator/events.py`) hands this publisher the due events; it sends
them with `PutEvents` in batches within EventBridge's limits (10 entries and 256 KB per call, an
entry's size counted as EventBridge counts it) and says, per event, whether EventBridge took it.
The dispatcher marks an outbox row delivered only after that answer, so publication is at least
once: a control plane killed between `PutEvents` and the row's update publishes the event again
after a restart. Both copies carry the outbox sequence number in `detail.seq`
(`aerie_contracts.events.SEQ`), the key a consumer dedupes on; Aerie's own handlers are
idempotent anyway (a second restart request gets 409).

The event is the one in-process handlers get (`repo.eventbridge`): same `source`, `detail-type`,
`detail` and `resources`, so the rules of the CDK app (`infra/aws/aerie_cdk/handlers.py`) match it
and the Lambda functions read it exactly as the in-process handlers do. EventBridge sets the
envelope's `id`, `account` and `region` itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger("aerie.eventbus")

MAX_ENTRIES = 10  # PutEvents: entries per call
MAX_BYTES = 256 * 1024  # PutEvents: total entry size per call, and the largest single entry


@dataclass(frozen=True)
class Outcome:
    """What became of one event: published, or why not, and whether trying again can help."""

    error: str | None = None
    permanent: bool = False


def entry(event: dict[str, Any], bus: str) -> dict[str, Any]:
    """One PutEvents entry from an EventBridge-shaped event (`repo.eventbridge`)."""
    return {
        "Source": event["source"],
        "DetailType": event["detail-type"],
        "Detail": json.dumps(event["detail"], separators=(",", ":"), default=str),
        "Resources": list(event.get("resources") or []),
        "Time": datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc),
        "EventBusName": bus,
    }


def entry_size(e: dict[str, Any]) -> int:
    """An entry's size as EventBridge counts it against the 256 KB limit ("Calculating PutEvents
    event entry size" in the EventBridge user guide): 14 bytes for a Time, plus the UTF-8 bytes of
    Source, DetailType, Detail and each resource."""
    size = 14 if e.get("Time") is not None else 0
    size += len(e["Source"].encode()) + len(e["DetailType"].encode())
    size += len(e.get("Detail", "").encode())
    size += sum(len(r.encode()) for r in e.get("Resources", ()))
    return size


def batches(entries: Sequence[dict[str, Any]]) -> Iterator[list[int]]:
    """Indexes of `entries` grouped into PutEvents calls: at most MAX_ENTRIES entries and MAX_BYTES
    per call, order kept. An entry too large on its own is left out (the caller reports it)."""
    batch: list[int] = []
    size = 0
    for i, e in enumerate(entries):
        n = entry_size(e)
        if n > MAX_BYTES:
            continue
        if batch and (len(batch) == MAX_ENTRIES or size + n > MAX_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(i)
        size += n
    if batch:
        yield batch


class EventBridgePublisher:
    """Publishes events to one bus with boto3 (region and credentials from the usual AWS chain;
    `AWS_ENDPOINT_URL` points it at a loopback EventBridge in tests)."""

    def __init__(self, bus: str, client: Any = None):
        if not bus:
            raise ValueError("an EventBridge bus name or ARN is required")
        self.bus = bus
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            # Short timeouts and few retries: publishing runs in the controller's loop, and an
            # event that could not be published stays pending in the outbox for a later pass.
            self._client = boto3.client(
                "events",
                config=Config(connect_timeout=3, read_timeout=10, retries={"mode": "standard", "max_attempts": 2}),
            )
        return self._client

    def publish(self, events: Sequence[dict[str, Any]]) -> list[Outcome]:
        """Publish `events`; one Outcome per event, in order."""
        entries = [entry(e, self.bus) for e in events]
        outcomes = [Outcome()] * len(entries)
        for i, e in enumerate(entries):
            if entry_size(e) > MAX_BYTES:
                outcomes[i] = Outcome(
                    f"event is {entry_size(e)} bytes, over EventBridge's {MAX_BYTES}-byte limit", permanent=True
                )
        for batch in batches(entries):
            try:
                answer = self.client.put_events(Entries=[entries[i] for i in batch])
            except Exception as exc:  # network, throttling, credentials: every entry of the call failed
                log.warning("PutEvents to %s failed: %s", self.bus, exc)
                for i in batch:
                    outcomes[i] = Outcome(f"PutEvents: {type(exc).__name__}: {exc}"[:1000])
                continue
            # Entries come back in request order; a failed one has ErrorCode instead of EventId.
            for i, result in zip(batch, answer.get("Entries", []), strict=False):
                if result.get("ErrorCode") or not result.get("EventId"):
                    code = result.get("ErrorCode") or "NoEventId"
                    outcomes[i] = Outcome(f"PutEvents entry: {code}: {result.get('ErrorMessage', '')}"[:1000])
            for i in batch[len(answer.get("Entries", [])) :]:
                outcomes[i] = Outcome("PutEvents answered fewer entries than it was sent")
        return outcomes
