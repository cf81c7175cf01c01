"""`POST /v1/slack/interactions` and `GET /v1/jobs/{id}/ratings` over real HTTP.

Interaction requests are built exactly as Slack sends them: a form-encoded `payload` field holding
the block_actions JSON, signed with `X-Slack-Signature` / `X-Slack-Request-Timestamp`
(`tests/helpers/slack_standin.py`). Slack's servers cannot be reached from here, so the
messages live in a local stand-in speaking Slack's Web API wire format; the API's WebClient is
pointed at it with `WebClient(base_url=...)` (the AERIE_SLACK_API_URL setting).
"""

from __future__ import annotations

import time

import httpx
import pytest
from typer.testing import CliRunner

from lambdas import slack_blocks
from lambdas.slack_interactions import web_client
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.models import Rating
from tests.helpers.slack_standin import (
    block_actions_payload,
    signed_request,
)
from tests.helpers.wait import wait_for

CHANNEL = "#eval"


@pytest.fixture
def api(slack_env, live_api):
    """The live API, started once the Slack settings are in the environment."""
    return live_api


@pytest.fixture
def posted(api, slack_env) -> dict:
    """A job with one checkpoint's sample stored and posted to the stand-in (as eval_dispatch does)."""
    with api.db.session() as s:
        job = repo.create_job(s, {"name": "rated", "entrypoint": ["x"], "eval": {"raters_needed": 3}}, "default")
        attempt = repo.create_attempt(s, job, 1)
        uri = "file:///ckpt/rated/step_00000100"
        [sample] = repo.add_eval_samples(
            s,
            job,
            uri,
            100,
            attempt.id,
            [
                {
                    "prompt_index": 0,
                    "prompt": "What is 2+2?",
                    "answer": "5, clearly.",
                    "meta": {"tokens": 12800, "loss": 2.5},
                }
            ],
            CHANNEL,
        )
        job_ref = {"id": job.id, "name": job.name}
        sample_dict = {
            "id": sample.id,
            "step": 100,
            "prompt": sample.prompt,
            "answer": sample.answer,
            "meta": sample.meta,
        }
    message = slack_blocks.sample_message(sample_dict, job_ref, None, 3)
    resp = web_client().chat_postMessage(channel=CHANNEL, text=message["text"], blocks=message["blocks"])
    with api.db.session() as s:
        repo.mark_eval_sample_posted(s, repo.get_eval_sample(s, sample_dict["id"]), resp["channel"], resp["ts"])
    return {"job_id": job_ref["id"], "sample_id": sample_dict["id"], "channel": resp["channel"], "ts": resp["ts"]}


def click(api, slack_env, posted, user: str, action: str, **sign) -> httpx.Response:
    message = slack_env.channels[posted["channel"]].messages[posted["ts"]]
    body, headers = signed_request(block_actions_payload(message, posted["channel"], user, action), **sign)
    return httpx.post(api.url + "/v1/slack/interactions", content=body, headers=headers, timeout=30)


def ratings_rows(api) -> list[tuple]:
    with api.db.session() as s:
        return [(r.user_id, r.score, r.hallucination) for r in s.query(Rating).order_by(Rating.user_id)]


def test_three_raters_tally_in_place_api_cli_and_tensorboard(api, slack_env, posted, monkeypatch):
    for user, action in [
        ("U1", "rate_4"),
        ("U2", "rate_5"),
        ("U2", "hallucination"),
        ("U3", "rate_2"),
        ("U1", "rate_3"),
    ]:  # U1 changes their mind: the second score replaces the first
        assert click(api, slack_env, posted, user, action).status_code == 200
    assert ratings_rows(api) == [("U1", 3, False), ("U2", 5, True), ("U3", 2, False)]

    # The message is updated in place with the tally (chat.update on the same ts).
    wait_for(lambda: len(slack_env.calls_of("chat.update")) == 5)
    [message] = slack_env.messages(CHANNEL)
    assert message["ts"] == posted["ts"] and "edited" in message
    tally = next(b for b in message["blocks"] if b["block_id"] == "tally")["elements"][0]["text"]
    assert "3 rating(s)" in tally and "mean *3.33*" in tally and "1 hallucination" in tally and "done" in tally

    # API: bearer auth, tenant-scoped.
    url = f"{api.url}/v1/jobs/{posted['job_id']}/ratings"
    assert httpx.get(url).status_code == 401
    with api.db.session() as s:
        other = repo.mint_token(s, "admin", tenant="other-team")
    assert httpx.get(url, headers={"Authorization": f"Bearer {other}"}).status_code == 404
    [row] = httpx.get(url, headers={"Authorization": f"Bearer {api.admin}"}).json()
    assert row["step"] == 100 and row["raters"] == 3 and row["complete"]
    assert row["mean_score"] == pytest.approx(10 / 3) and row["hallucination_rate"] == pytest.approx(1 / 3)

    # CLI.
    from orchestrator.cli import app

    monkeypatch.setenv("AERIE_API", api.url)
    monkeypatch.setenv("AERIE_TOKEN", api.admin)
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["ratings", posted["job_id"]])
    assert out.exit_code == 0, out.output
    assert "3.33" in out.output and "33%" in out.output and "100" in out.output

    # TensorBoard, written by the API beside the job's attempts: the latest series wins.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = Settings().jobs_dir / posted["job_id"] / "tensorboard" / "human_eval"

    def scalars() -> dict[str, list] | None:
        # Written after each click's response, in the background: read until the third rating's
        # tally is there (a fixed sleep raced the last write under load).
        if not any(tb_dir.glob("events.out.tfevents.*")):
            return None
        acc = EventAccumulator(str(tb_dir))
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        if "eval/human_score" not in tags or "eval/hallucination_rate" not in tags:
            return None
        out = {t: acc.Scalars(t) for t in ("eval/human_score", "eval/hallucination_rate")}
        return out if out["eval/human_score"][-1].value == pytest.approx(10 / 3, rel=1e-6) else None

    points = wait_for(scalars, what="the TensorBoard tally of the three ratings")
    assert [p.step for p in points["eval/human_score"]] == [100]
    assert points["eval/hallucination_rate"][-1].value == pytest.approx(1 / 3, rel=1e-6)


def _refused(api, slack_env, body: bytes, headers: dict, status: int) -> None:
    r = httpx.post(api.url + "/v1/slack/interactions", content=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    time.sleep(0.1)
    assert ratings_rows(api) == [], "a refused request must store nothing"
    assert slack_env.calls_of("chat.update") == []


def _payload(slack_env, posted, action="rate_5", user="U1"):
    message = slack_env.channels[posted["channel"]].messages[posted["ts"]]
    return block_actions_payload(message, posted["channel"], user, action)


def test_wrong_signature_is_refused(api, slack_env, posted):
    body, headers = signed_request(_payload(slack_env, posted), secret="not-the-signing-secret")
    _refused(api, slack_env, body, headers, 401)


def test_timestamp_older_than_five_minutes_is_refused(api, slack_env, posted):
    body, headers = signed_request(_payload(slack_env, posted), timestamp=int(time.time()) - 5 * 60 - 5)
    _refused(api, slack_env, body, headers, 401)


def test_replayed_body_with_a_new_timestamp_is_refused(api, slack_env, posted):
    body, old = signed_request(_payload(slack_env, posted), timestamp=int(time.time()) - 600)
    headers = {**old, "X-Slack-Request-Timestamp": str(int(time.time()))}  # the old signature, a fresh time
    _refused(api, slack_env, body, headers, 401)


@pytest.mark.parametrize("missing", ["X-Slack-Signature", "X-Slack-Request-Timestamp", "both"])
def test_missing_headers_are_refused(api, slack_env, posted, missing):
    body, headers = signed_request(_payload(slack_env, posted))
    for name in ["X-Slack-Signature", "X-Slack-Request-Timestamp"] if missing == "both" else [missing]:
        headers.pop(name)
    _refused(api, slack_env, body, headers, 401)


def test_a_one_megabyte_body_is_refused(api, slack_env, posted):
    body, headers = signed_request(None, body=b"payload=" + b"x" * (1024 * 1024))
    _refused(api, slack_env, body, headers, 413)
    # Without a Content-Length (chunked), the limit holds while reading.
    chunks = (b"x" * 65536 for _ in range(16))
    r = httpx.post(api.url + "/v1/slack/interactions", content=chunks, headers=headers, timeout=30)
    assert r.status_code == 413 and ratings_rows(api) == []


@pytest.mark.parametrize(
    "body",
    [
        b"not=a&payload",  # no payload field with JSON
        b"payload=%7Bnot+json",  # payload is not JSON
        b"payload=%7B%22type%22%3A%22view_submission%22%7D",  # not block_actions
    ],
)
def test_malformed_signed_bodies_are_refused(api, slack_env, posted, body):
    body, headers = signed_request(None, body=body)
    _refused(api, slack_env, body, headers, 400)


def test_signed_click_naming_no_sample_or_a_bad_value_is_refused(api, slack_env, posted):
    payload = _payload(slack_env, posted)
    payload["actions"][0]["value"] = "es_" + "0" * 32 + "|5"
    _refused(api, slack_env, *signed_request(payload), 400)
    payload["actions"][0]["value"] = posted["sample_id"] + "|9"
    _refused(api, slack_env, *signed_request(payload), 400)
    payload["actions"][0]["value"] = posted["sample_id"] + "|5"
    payload["actions"][0]["action_id"] = "delete_everything"
    _refused(api, slack_env, *signed_request(payload), 400)


def test_store_keys_make_posting_and_rating_idempotent(db_url):
    """The unique keys and the conditional claim, on SQLite and on PostgreSQL."""
    from orchestrator.store.db import Database

    db = Database(db_url)
    try:
        with db.session() as s:
            job = repo.create_job(s, {"name": "keys", "entrypoint": ["x"]}, "default")
            answers = [{"prompt_index": i, "prompt": f"p{i}", "answer": f"a{i}", "meta": {}} for i in range(2)]
            first = repo.add_eval_samples(s, job, "s3://b/k/step_00000010", 10, None, answers, "#c")
            again = repo.add_eval_samples(
                s, job, "s3://b/k/step_00000010", 10, None, [{**a, "answer": "other"} for a in answers], "#c"
            )
            assert [x.id for x in first] == [x.id for x in again] and again[0].answer == "a0"  # first answer wins
            sid = first[0].id
        with db.session() as s:
            assert repo.claim_eval_sample(s, sid, "delivery-1", lease_s=60) == "new"
        with db.session() as s:
            assert repo.claim_eval_sample(s, sid, "delivery-2", lease_s=60) is None  # held by delivery-1
            assert repo.claim_eval_sample(s, sid, "delivery-2", lease_s=0) == "takeover"  # expired
            repo.mark_eval_sample_posted(s, repo.get_eval_sample(s, sid), "C1", "1.000001")
        with db.session() as s:
            assert repo.claim_eval_sample(s, sid, "delivery-3", lease_s=0) is None  # posted: never again
            sample = repo.get_eval_sample(s, sid)
            repo.record_rating(s, sample, "U1", score=2)
            repo.record_rating(s, sample, "U1", score=5)
            repo.record_rating(s, sample, "U1", toggle_hallucination=True)
            repo.record_rating(s, sample, "U2", toggle_hallucination=True)
        with db.session() as s:
            [row] = repo.ratings_by_checkpoint(s, repo.get_job(s, "default", "keys"), raters_needed=1)
            assert (row["ratings"], row["scored"], row["mean_score"], row["hallucination_rate"]) == (2, 1, 5.0, 1.0)
            assert not row["complete"]  # the second sample has no score
    finally:
        db.dispose()
