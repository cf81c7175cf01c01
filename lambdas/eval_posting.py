"""Posting an eval sample to Slack exactly once, across redeliveries and crashes.

A sample is posted only by the delivery that claimed it (an atomic conditional update in the
store); a claim left by a delivery that died mid-post expires after `LEASE_S`, and whoever takes
it over first looks in the channel's history for a message carrying the sample's id in its
metadata before posting, so even that crash window posts once. Rate limits: the WebClient retries
429s after Retry-After (slack_sdk's RateLimitErrorRetryHandler)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aerie_contracts import routes
from lambdas import slack_blocks
from lambdas.api import Api

if TYPE_CHECKING:
    from slack_sdk import WebClient

METADATA_EVENT = "aerie_eval_sample"
LEASE_S = 120.0


def post_once(
    api: Api,
    client: WebClient,
    sample: dict[str, Any],
    job: dict[str, Any],
    channel: str,
    raters: int,
    claim: str,
    context: Any,
) -> bool:
    """Post `sample` unless it was posted; True when this call posted it."""
    deadline = time.time() + min(LEASE_S + 30, _remaining_s(context))
    while True:
        got = api.call("POST", routes.eval_sample_claim(sample["id"]), {"claim": claim, "lease_s": LEASE_S})
        current = got["sample"]
        if current.get("slack_ts"):
            return False
        if got["claimed"]:
            break
        if time.time() > deadline:  # another delivery holds it; the event is retried later
            raise TimeoutError(f"sample {sample['id']} is being posted by another delivery")
        time.sleep(2.0)
    channel = current.get("slack_channel") or channel
    if got["claimed"] == "takeover":
        ts = find_posted(client, channel, current)
        if ts:
            api.call("POST", routes.eval_sample_posted(sample["id"]), {"channel": channel, "ts": ts})
            return False
    message = slack_blocks.sample_message(current, job, None, raters)
    resp = client.chat_postMessage(
        channel=channel,
        text=message["text"],
        blocks=message["blocks"],
        metadata={"event_type": METADATA_EVENT, "event_payload": {"sample_id": current["id"]}},
        unfurl_links=False,
        unfurl_media=False,
    )
    api.call("POST", routes.eval_sample_posted(sample["id"]), {"channel": resp["channel"], "ts": resp["ts"]})
    return True


def find_posted(client: WebClient, channel: str, sample: dict[str, Any]) -> str | None:
    """The ts of a message already posted for this sample (by a delivery that died before
    recording it), found by the sample id in the message metadata."""
    oldest = str(float(sample.get("created_at") or 0) - 60) if sample.get("created_at") else None
    cursor = None
    while True:
        kwargs: dict[str, Any] = {"channel": channel, "include_all_metadata": True, "limit": 200}
        if oldest:
            kwargs["oldest"] = oldest
        if cursor:
            kwargs["cursor"] = cursor
        resp = client.conversations_history(**kwargs)
        messages: list[dict[str, Any]] = resp.get("messages", [])
        for message in messages:
            meta = message.get("metadata") or {}
            if (
                meta.get("event_type") == METADATA_EVENT
                and (meta.get("event_payload") or {}).get("sample_id") == sample["id"]
            ):
                ts: str = message["ts"]
                return ts
        cursor = (resp.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            return None


def _remaining_s(context: Any) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000.0 - 5 if remaining else LEASE_S
