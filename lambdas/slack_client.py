"""The Slack Web API client the eval handlers use, and the message update after a rating."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from aerie_contracts import env
from lambdas import slack_blocks
from lambdas.api import secret_setting

if TYPE_CHECKING:
    from slack_sdk import WebClient

SLACK_API_URL = "https://slack.com/api/"


def web_client(token: str | None = None, base_url: str | None = None, max_retries: int = 3) -> WebClient:
    """A WebClient that waits out 429s (Retry-After) with slack_sdk's own retry handler.

    Token: `SLACK_BOT_TOKEN` (or `AERIE_SLACK_BOT_TOKEN`, or the Secrets Manager secret
    `AERIE_SLACK_BOT_TOKEN_ARN` names, as in AWS Lambda); API: `AERIE_SLACK_API_URL`, which tests
    point at a local stand-in because Slack's servers cannot be reached from here."""
    from slack_sdk import WebClient
    from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

    token = token or secret_setting(env.SLACK_BOT_TOKEN, "SLACK_BOT_TOKEN")
    base_url = base_url or os.environ.get(env.SLACK_API_URL) or SLACK_API_URL
    if not base_url.endswith("/"):
        base_url += "/"
    return WebClient(
        token=token,
        base_url=base_url,
        timeout=30,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=max_retries)],
    )


def update_message(
    client: WebClient,
    channel: str,
    ts: str,
    sample: dict[str, Any],
    job: dict[str, Any],
    tally: dict[str, Any],
    raters_needed: int,
) -> None:
    """Rewrite the sample's message in place with the current tally."""
    message = slack_blocks.sample_message(sample, job, tally, raters_needed)
    client.chat_update(channel=channel, ts=ts, text=message["text"], blocks=message["blocks"])
