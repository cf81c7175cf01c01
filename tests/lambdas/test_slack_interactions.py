"""slack_interactions as AWS would invoke it: an API Gateway proxy event carrying Slack's request.

The request is built exactly as Slack sends it (form-encoded `payload`, `X-Slack-Signature`,
`X-Slack-Request-Timestamp`); the handler records through the real API over HTTP and updates the
message with the real `slack_sdk.WebClient`, pointed (`WebClient(base_url=...)`) at a local
stand-in speaking Slack's Web API wire format, since Slack's servers cannot be reached from here.
"""

from __future__ import annotations

import base64
import time

import pytest

from lambdas import slack_blocks, slack_interactions
from lambdas.slack_interactions import Refused, parse_actions, verify_request
from orchestrator.store import repo
from tests.helpers.slack_standin import (
    SIGNING_SECRET,
    block_actions_payload,
    signed_request,
)

SAMPLE = {
    "id": "es_" + "a" * 32,
    "step": 7,
    "prompt": "Say <hi> & go",
    "answer": "x" * 10_000,
    "meta": {"tokens": 1234, "loss": 3.21},
}
JOB = {"id": "j-1", "name": "j"}


def _message() -> dict:
    return {"ts": "1.000001", **slack_blocks.sample_message(SAMPLE, JOB, None, 3)}


def test_block_kit_respects_slacks_limits():
    message = _message()
    blocks = message["blocks"]
    slack_blocks.validate(blocks)
    assert len(blocks) <= 50
    answer = next(b for b in blocks if b.get("block_id") == "answer")["text"]["text"]
    assert len(answer) <= 3000 and answer.endswith("…```")  # a long answer is cut to fit
    assert "&lt;hi&gt; &amp; go" in str(blocks)
    ids = [el["action_id"] for b in blocks if b["type"] == "actions" for el in b["elements"]]
    assert ids == ["rate_1", "rate_2", "rate_3", "rate_4", "rate_5", "hallucination"]
    for broken in (
        blocks * 9,  # 54 blocks
        [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}],
        [{"type": "actions", "elements": [blocks[4]["elements"][0]] * 2}],  # duplicate action_id
        [{"type": "video"}],
    ):
        with pytest.raises(slack_blocks.InvalidBlocks):
            slack_blocks.validate(broken)


def test_verify_and_parse_a_signed_click():
    body, headers = signed_request(block_actions_payload(_message(), "C1", "U9", "rate_4"))
    verify_request(headers, body, SIGNING_SECRET)
    [action] = parse_actions(body)
    assert (action.sample_id, action.user_id, action.score, action.toggle_hallucination) == (
        SAMPLE["id"],
        "U9",
        4,
        False,
    )
    assert (action.channel, action.message_ts) == ("C1", "1.000001")
    body, headers = signed_request(block_actions_payload(_message(), "C1", "U9", "hallucination"))
    assert parse_actions(body)[0].toggle_hallucination


@pytest.mark.parametrize(
    "case,status",
    [("wrong secret", 401), ("stale", 401), ("replay", 401), ("no headers", 401), ("big", 413), ("future", 401)],
)
def test_verify_refuses(case, status):
    payload = block_actions_payload(_message(), "C1", "U9", "rate_4")
    if case == "wrong secret":
        body, headers = signed_request(payload, secret="other")
    elif case == "stale":
        body, headers = signed_request(payload, timestamp=int(time.time()) - 301)
    elif case == "future":
        body, headers = signed_request(payload, timestamp=int(time.time()) + 301)
    elif case == "replay":
        body, headers = signed_request(payload, timestamp=int(time.time()) - 400)
        headers["X-Slack-Request-Timestamp"] = str(int(time.time()))
    elif case == "no headers":
        body, headers = signed_request(payload)
        headers = {"Content-Type": headers["Content-Type"]}
    else:
        body, headers = signed_request(None, body=b"payload=" + b"x" * (1 << 20))
    with pytest.raises(Refused) as info:
        verify_request(headers, body, SIGNING_SECRET)
    assert info.value.status == status


def _gateway_event(body: bytes, headers: dict, b64: bool) -> dict:
    """API Gateway (REST, proxy integration) as it hands Slack's POST to a Lambda."""
    return {
        "resource": "/slack/interactions",
        "path": "/slack/interactions",
        "httpMethod": "POST",
        "headers": headers,
        "isBase64Encoded": b64,
        "body": base64.b64encode(body).decode() if b64 else body.decode(),
    }


def test_lambda_handler_records_through_the_api_and_updates_the_message(slack_env, api):
    with api.db.session() as s:
        job = repo.create_job(s, {"name": "lam", "entrypoint": ["x"]}, "default")
        [sample] = repo.add_eval_samples(
            s,
            job,
            "file:///c/step_00000007",
            7,
            None,
            [{"prompt_index": 0, "prompt": "p", "answer": "a", "meta": {}}],
            "#eval",
        )
        sid, job_ref = sample.id, {"id": job.id, "name": job.name}
    message = slack_blocks.sample_message({"id": sid, "step": 7, "prompt": "p", "answer": "a", "meta": {}}, job_ref)
    resp = slack_interactions.web_client().chat_postMessage(channel="#eval", **message)
    with api.db.session() as s:
        repo.mark_eval_sample_posted(s, repo.get_eval_sample(s, sid), resp["channel"], resp["ts"])
    ctx = api.context("slack_interactions")
    posted = slack_env.channels[resp["channel"]].messages[resp["ts"]]
    for i, (user, action) in enumerate([("U1", "rate_2"), ("U2", "rate_4"), ("U2", "hallucination")]):
        body, headers = signed_request(block_actions_payload(posted, resp["channel"], user, action))
        assert slack_interactions.handler(_gateway_event(body, headers, b64=i % 2 == 0), ctx)["statusCode"] == 200
    bad_body, bad_headers = signed_request(block_actions_payload(posted, resp["channel"], "U3", "rate_5"), secret="x")
    assert slack_interactions.handler(_gateway_event(bad_body, bad_headers, False), ctx)["statusCode"] == 401
    with api.db.session() as s:
        rows = repo.ratings_by_checkpoint(s, repo.get_job(s, "default", job_ref["id"]))
    assert rows[0]["mean_score"] == 3.0 and rows[0]["hallucination_rate"] == 0.5 and rows[0]["raters"] == 2
    assert len(slack_env.calls_of("chat.update")) == 3
    tally = slack_env.messages("#eval")[0]["blocks"][-1]["elements"][0]["text"]
    assert "2 rating(s)" in tally and "mean *3.00*" in tally
