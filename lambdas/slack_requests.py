"""A Slack interaction request, verified and parsed before anything is stored.

Slack signs every interaction request with the app's signing secret: `X-Slack-Signature` is
`v0=` + HMAC-SHA256 of `v0:<X-Slack-Request-Timestamp>:<raw body>`. That signature is the only
credential Slack can present (it sends no bearer token), so the endpoint is authenticated by it
instead of an Aerie token: `verify_request` refuses, before anything is parsed or stored,
  - a body over the size limit (413; Slack's payloads are a few KB),
  - missing headers (401), a timestamp more than 5 minutes off (401: replay window),
  - a wrong signature (401; `slack_sdk.signature.SignatureVerifier`, `hmac.compare_digest`), which
    also covers an old body replayed with a fresh timestamp (the timestamp is signed),
and `parse_actions` refuses anything that is not a block_actions payload naming our samples (400).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from slack_sdk.signature import SignatureVerifier

from lambdas import slack_blocks

REPLAY_WINDOW_S = 5 * 60
MAX_BODY_BYTES = 64 * 1024


class Refused(Exception):
    """A request to turn away, with the HTTP status to answer."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RatingAction:
    sample_id: str
    user_id: str
    user_name: str
    score: int | None
    toggle_hallucination: bool
    channel: str | None
    message_ts: str | None
    response_url: str | None


def verify_request(
    headers: Mapping[str, str],
    body: bytes,
    signing_secret: str,
    *,
    max_bytes: int = MAX_BODY_BYTES,
    now: float | None = None,
) -> None:
    """Raise Refused unless Slack signed exactly this body within the replay window."""
    if len(body) > max_bytes:
        raise Refused(413, f"body over {max_bytes} bytes")
    if not signing_secret:  # nothing can be verified: as if the endpoint were not there
        raise Refused(404, "Slack interactions are not configured here (no signing secret)")
    lower = {k.lower(): v for k, v in headers.items()}
    timestamp, signature = lower.get("x-slack-request-timestamp"), lower.get("x-slack-signature")
    if not timestamp or not signature:
        raise Refused(401, "missing X-Slack-Request-Timestamp or X-Slack-Signature")
    try:
        ts = int(timestamp)
    except ValueError:
        raise Refused(401, "X-Slack-Request-Timestamp is not an integer") from None
    if abs((time.time() if now is None else now) - ts) > REPLAY_WINDOW_S:
        raise Refused(401, "request timestamp outside the 5-minute window")
    try:
        ok = SignatureVerifier(signing_secret).is_valid(body=body, timestamp=timestamp, signature=signature)
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "body is not UTF-8 form data") from None
    if not ok:
        raise Refused(401, "invalid signature")


def parse_actions(body: bytes) -> list[RatingAction]:
    """The rating clicks in a signed `block_actions` payload (form field `payload`, JSON)."""
    try:
        form = urllib.parse.parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=10)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        raise Refused(400, "expected a form field `payload` holding JSON") from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        raise Refused(400, "only block_actions payloads are handled")
    user = payload.get("user") or {}
    actions = payload.get("actions")
    if (
        not isinstance(user, dict)
        or not isinstance(user.get("id"), str)
        or not isinstance(actions, list)
        or not actions
    ):
        raise Refused(400, "payload lacks user or actions")
    container = payload.get("container") or {}
    channel = (payload.get("channel") or {}).get("id") or container.get("channel_id")
    message_ts = (payload.get("message") or {}).get("ts") or container.get("message_ts")
    out = []
    for action in actions:
        if not isinstance(action, dict):
            raise Refused(400, "malformed action")
        aid = action.get("action_id", "")
        if not (aid == slack_blocks.HALLUCINATION or str(aid).startswith(slack_blocks.RATE_PREFIX)):
            raise Refused(400, f"unknown action {aid!r}")
        try:
            sample_id, score, toggle = slack_blocks.parse_value(action.get("value", ""))
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        out.append(
            RatingAction(
                sample_id,
                user["id"],
                str(user.get("username") or user.get("name") or "")[:128],
                score,
                toggle,
                channel,
                message_ts,
                payload.get("response_url"),
            )
        )
    return out
