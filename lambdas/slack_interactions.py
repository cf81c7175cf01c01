"""Slack's button clicks on eval samples: verify, parse, record the rating, update the message.

The request is verified by its Slack signature and parsed before anything is stored
(`lambdas/slack_requests.py`); the message is updated through `lambdas/slack_client.py`.

Two ways in, one logic:
  - `POST /v1/slack/interactions` in the API (`orchestrator/api/routes/slack.py`) uses the
    functions here and writes to the store directly;
  - `handler(event, context)` is the same endpoint as an AWS Lambda behind API Gateway (proxy
    event): it verifies, then records through the API with the service token
    (`POST /v1/eval/samples/{id}/ratings`) and updates the message with `chat_update`.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from aerie_contracts import env, routes
from lambdas.api import secret_setting
from lambdas.slack_client import update_message, web_client
from lambdas.slack_requests import MAX_BODY_BYTES, REPLAY_WINDOW_S, RatingAction, Refused, parse_actions, verify_request

log = logging.getLogger("aerie.lambdas.slack_interactions")

# The API's route (orchestrator/api/routes/slack.py) and the eval handler use these from here.
__all__ = [
    "MAX_BODY_BYTES",
    "REPLAY_WINDOW_S",
    "RatingAction",
    "Refused",
    "handler",
    "parse_actions",
    "update_message",
    "verify_request",
    "web_client",
]


# --- the Lambda form (API Gateway proxy event) -------------------------------------------------------


def _response(status: int, body: str = "") -> dict[str, Any]:
    return {"statusCode": status, "headers": {"Content-Type": "text/plain"}, "body": body}


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from lambdas.api import Api

    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode("utf-8")
    secret = secret_setting(env.SLACK_SIGNING_SECRET, "SLACK_SIGNING_SECRET")
    try:
        verify_request(event.get("headers") or {}, body, secret)
        actions = parse_actions(body)
    except Refused as exc:
        log.warning("refused a Slack interaction: %s", exc.reason)
        return _response(exc.status, exc.reason)
    api = Api.from_context(context)
    client = web_client()
    for action in actions:
        result = api.call(
            "POST",
            routes.eval_sample_ratings(action.sample_id),
            {
                "user_id": action.user_id,
                "user_name": action.user_name,
                "score": action.score,
                "toggle_hallucination": action.toggle_hallucination,
            },
        )
        sample = result["sample"]
        channel, ts = sample.get("slack_channel") or action.channel, sample.get("slack_ts") or action.message_ts
        if channel and ts:
            update_message(client, channel, ts, sample, result["job"], result["tally"], result["raters_needed"])
    return _response(200)
